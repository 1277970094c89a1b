//! A pod this kubelet runs: its namespace, directory and containers' state, shared by the
//! tasks that run, probe and report it.

use std::fs;

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;
use std::sync::atomic::AtomicBool;

use anyhow::{Context, Result};

use tokio::sync::Notify;

use super::*;

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
    pub(super) phase: Mutex<(String, Option<String>)>,
    pub(super) stopping: AtomicBool,
    pub(super) changed: Notify,
    pub(super) initialized: AtomicBool,
}

impl PodRun {
    pub(super) fn with<R>(
        &self,
        name: &str,
        f: impl FnOnce(&mut ContainerState) -> R,
    ) -> Option<R> {
        let mut cs = lock(&self.containers);
        cs.iter_mut().find(|c| c.name == name).map(f)
    }

    pub fn container(&self, name: &str) -> Option<ContainerState> {
        self.with(name, |c| c.clone())
    }

    pub(super) fn set_phase(&self, phase: &str, message: Option<String>) {
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

/// `argv` as container `c` runs it: in the pod's network namespace and directory, as its user
/// with its capabilities (`setpriv`), with its env.
pub(super) fn container_command(run: &PodRun, c: &ContainerState, argv: &[String]) -> Command {
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
