//! A container as this kubelet runs it: prepared from the spec (image, command, user,
//! capabilities, env, mounts), started in the pod's namespaces, supervised with its restart
//! policy, and its lifecycle handlers.

use std::fs;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::{Context, Result, bail};

use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::status::*;
use super::*;

/// The PATH of every container (the node's tools are the images' filesystems).
pub(super) const CONTAINER_PATH: &str =
    "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// A container ready to run: its state and command line.
#[derive(Clone)]
pub(super) struct Prepared {
    pub(super) state: ContainerState,
    pub(super) argv: Vec<String>,
    pub(super) spec: Container,
}

pub(super) async fn prepare(
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
pub(super) fn service_env(inner: &Inner, namespace: &str) -> Vec<(String, String)> {
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

pub(super) fn spawn_container(run: &PodRun, p: &Prepared) -> Result<tokio::process::Child> {
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

pub(super) async fn run_to_completion(inner: &Inner, run: &PodRun, p: &Prepared) -> Result<i32> {
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

pub(super) fn nix_signal(status: &std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status.signal().unwrap_or(0)
}

/// Runs a long-lived container, restarting it as `restart_policy` says until the pod stops.
pub(super) async fn supervise(
    inner: Arc<Inner>,
    run: Arc<PodRun>,
    p: Prepared,
    restart_policy: String,
) {
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
pub(super) fn finished(run: &PodRun) {
    let cs = lock(&run.containers).clone();
    let regular: Vec<&ContainerState> = cs.iter().filter(|c| !c.init).collect();
    if regular.iter().all(|c| c.state.get("terminated").is_some()) {
        let ok = regular
            .iter()
            .all(|c| c.state["terminated"]["exitCode"].as_i64() == Some(0));
        run.set_phase(if ok { "Succeeded" } else { "Failed" }, None);
    }
}

pub(super) async fn post_start(inner: &Inner, run: &PodRun, p: &Prepared) -> Result<()> {
    let Some(h) = p.spec.lifecycle.as_ref().and_then(|l| l.post_start.clone()) else {
        return Ok(());
    };
    run_handler(inner, run, p, &h, "postStart").await
}

pub(super) async fn run_handler(
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

pub(super) fn kill_pid(pid: Option<i32>) {
    if let Some(pid) = pid {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

pub(super) fn port_of(c: &Container, port: &IntOrString) -> Result<u16> {
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
