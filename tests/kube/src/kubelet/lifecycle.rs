//! A pod's life: made into a run, its sandbox and volumes prepared, init containers then
//! containers started, supervised and probed, its status written, and terminated with its grace
//! period.

use std::collections::HashMap;
use std::fs;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use k8s_openapi::api::core::v1::{Container, Pod};
use kube::api::{Api, DeleteParams, Preconditions};

use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

use super::containers::*;
use super::probes::*;
use super::sandbox::*;
use super::spec::*;
use super::status::*;
use super::volumes;
use super::*;

pub(super) fn new_run(inner: &Inner, pod: &Pod) -> Result<PodRun> {
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

pub(super) async fn run_pod(inner: Arc<Inner>, run: Arc<PodRun>, mut rx: watch::Receiver<Pod>) {
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
pub(super) async fn start_pod(
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

pub(super) fn cluster_tail(log: &Path) -> String {
    harness::tail(&fs::read_to_string(log).unwrap_or_default(), 10)
}

/// Stops the pod as the kubelet does: preStop hooks and SIGTERM for the containers, SIGKILL for
/// what is left after the grace period; native sidecars after the containers, in reverse order.
pub(super) async fn terminate(inner: &Inner, run: &PodRun, pod: &Pod, grace: Duration) {
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

pub(super) fn teardown(inner: &Inner, run: &PodRun) {
    harness::kill_all_in(&run.netns);
    // Torn down once: by the pod's task, or by the kubelet's shutdown if that task never ended.
    harness::sandbox::remove(&run.netns);
    if let Some(n) = run.ip.rsplit('.').next().and_then(|n| n.parse::<u8>().ok()) {
        lock(&inner.ips).remove(&n);
    }
}

pub(super) async fn delete_now(inner: &Inner, ns: &str, name: &str, uid: &str) {
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

pub(super) async fn refresh_tokens(
    inner: Arc<Inner>,
    pod: Pod,
    mut tokens: Vec<volumes::TokenFile>,
) {
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
