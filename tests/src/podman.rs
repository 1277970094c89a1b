//! Pods of containers with podman: the proxy and control-plane images built by
//! `scripts/image.sh --debug --tag test` run as Kubernetes would run them, each pod's containers
//! sharing one network namespace that the harness made (a `Network` pod: veth, addresses).

use std::process::{Command, Output};

use anyhow::{Context, Result, bail};

use crate::{PREFIX, binary, cannot_run, orphaned, run};

/// The proxy image the tests run (Istio's proxyv2 role).
pub const PROXY_IMAGE: &str = "localhost/istio-rs/proxyv2:test";
/// The control-plane image (`istiod-core`).
pub const ISTIOD_IMAGE: &str = "localhost/istio-rs/istiod:test";
/// The label `scripts/image.sh` puts on both images: the sha256 of the binaries inside.
const BINARIES_LABEL: &str = "istio-rs.binaries";

/// Runs `podman --runtime runc ARGS` (crun fails on this kernel's hybrid cgroups).
pub fn podman(args: &[&str]) -> Result<Output> {
    Command::new("podman")
        .arg("--runtime")
        .arg("runc")
        .args(args)
        .output()
        .context("spawn podman")
}

/// Like `podman`, failing with its output unless it succeeds; returns stdout, trimmed.
pub fn podman_ok(args: &[&str]) -> Result<String> {
    let mut all = vec!["--runtime", "runc"];
    all.extend(args);
    let out = run("podman", &all)?;
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The sha256 of the debug binaries and the proxy module, in the order `scripts/image.sh`
/// hashes them.
fn binaries_hash() -> Result<String> {
    let files: Vec<String> = [
        "pilot-agent",
        "istio-iptables",
        "istiod-core",
        "libistio_module.so",
    ]
    .iter()
    .map(|b| binary(b).display().to_string())
    .collect();
    let out = Command::new("sh")
        .arg("-c")
        .arg("cat \"$@\" | sha256sum")
        .arg("sh")
        .args(&files)
        .output()?;
    if !out.status.success() {
        bail!(
            "hashing {files:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string())
}

/// True if podman runs and both test images exist and hold the binaries this test run was
/// built with; a missing or stale image fails the test (or skips it, when asked; see
/// `cannot_run`), naming the command that builds them.
pub fn require_images(test: &str) -> bool {
    let check = || -> Result<()> {
        let want = binaries_hash()?;
        for image in [PROXY_IMAGE, ISTIOD_IMAGE] {
            let label = format!("{{{{index .Labels \"{BINARIES_LABEL}\"}}}}");
            let have = podman_ok(&["image", "inspect", "--format", &label, image])
                .with_context(|| format!("image {image}"))?;
            if have != want {
                bail!("image {image} holds other binaries than target/ (stale)");
            }
        }
        Ok(())
    };
    match check() {
        Ok(()) => true,
        Err(e) => cannot_run(&format!(
            "{test}: {e:#}; build the images with ./scripts/image.sh --debug --tag test"
        )),
    }
}

/// Removes pods and containers left by test processes that no longer exist.
pub fn sweep_stale_pods() {
    let Ok(out) = podman(&["pod", "ls", "--format", "{{.Name}}"]) else {
        return;
    };
    for name in String::from_utf8_lossy(&out.stdout).lines() {
        if orphaned(name) {
            let _ = podman(&["pod", "rm", "--force", "--time", "0", name]);
        }
    }
}

/// A podman pod; its containers join the network namespace `netns` (a harness pod's), so they
/// share it as a Kubernetes pod's containers do. Removed with its containers when dropped.
pub struct PodmanPod {
    pub name: String,
    netns: String,
}

impl PodmanPod {
    /// Creates the pod `PREFIX-PID-name` (shared IPC and UTS; the network is the harness's).
    pub fn create(name: &str, netns: &str) -> Result<PodmanPod> {
        sweep_stale_pods();
        let name = format!("{PREFIX}-{}-{name}", std::process::id());
        podman_ok(&["pod", "create", "--name", &name, "--share", "ipc,uts"])?;
        Ok(PodmanPod {
            name,
            netns: netns.to_string(),
        })
    }

    /// The full name of container `short` in this pod.
    pub fn container(&self, short: &str) -> String {
        format!("{}-{short}", self.name)
    }

    /// Creates container `short` in the pod: `opts` are podman options (user, mounts, env...),
    /// then the image and its args. `init` makes it an init container (run to completion, in
    /// order, before the others; the pod does not start if it fails).
    pub fn add(
        &self,
        short: &str,
        init: bool,
        opts: &[&str],
        image_and_args: &[&str],
    ) -> Result<()> {
        let name = self.container(short);
        let netns = format!("ns:/run/netns/{}", self.netns);
        let mut args = vec![
            "create",
            "--pod",
            &self.name,
            "--name",
            &name,
            "--network",
            &netns,
        ];
        if init {
            args.extend(["--init-ctr", "always"]);
        }
        args.extend(opts);
        args.extend(image_and_args);
        podman_ok(&args)?;
        Ok(())
    }

    /// Starts the pod: its init containers in order, then the others.
    pub fn start(&self) -> Result<Output> {
        podman(&["pod", "start", &self.name])
    }

    /// `podman exec` in container `short`.
    pub fn exec(&self, short: &str, args: &[&str]) -> Result<Output> {
        let name = self.container(short);
        let mut all = vec!["exec", name.as_str()];
        all.extend(args);
        podman(&all)
    }

    /// The state (`created`, `running`, `exited`) and exit code of container `short`.
    pub fn state(&self, short: &str) -> Result<(String, i32)> {
        let out = podman_ok(&[
            "inspect",
            "--format",
            "{{.State.Status}} {{.State.ExitCode}}",
            &self.container(short),
        ])?;
        let (status, code) = out.split_once(' ').unwrap_or((&out, "0"));
        Ok((status.to_string(), code.parse().unwrap_or(-1)))
    }

    /// Logs of container `short` (stdout and stderr).
    pub fn logs(&self, short: &str) -> String {
        match podman(&["logs", &self.container(short)]) {
            Ok(out) => format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
            Err(e) => format!("(no logs: {e})"),
        }
    }

    /// Every container's logs, for failure messages.
    pub fn all_logs(&self) -> String {
        let Ok(names) = podman_ok(&[
            "ps",
            "--all",
            "--filter",
            &format!("pod={}", self.name),
            "--format",
            "{{.Names}}",
        ]) else {
            return String::new();
        };
        let prefix = format!("{}-", self.name);
        names
            .lines()
            .filter_map(|n| n.strip_prefix(&prefix))
            .map(|short| format!("---- {} {short}\n{}", self.name, self.logs(short)))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for PodmanPod {
    fn drop(&mut self) {
        let _ = podman(&["pod", "rm", "--force", "--time", "0", &self.name]);
    }
}
