//! A VM as Istio's VM guide makes one: a fresh Debian root (mmdebstrap, minbase) with our
//! `istio-sidecar.deb` (built by `./scripts/deb.sh --debug`, which scripts/test.sh runs)
//! installed by apt, the files `istioctl x workload entry configure` writes put where the guide
//! says, and the package's start script run as the systemd unit's ExecStart, in a container on
//! that root inside the VM's network namespace (root, with NET_ADMIN and NET_RAW as the start
//! script needs). The VM test against istiod-core and the Kubernetes VM tests both use it.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Output;

use anyhow::{Context, Result, bail};

use crate::podman::{podman, podman_ok};
use crate::{binary, run, write_readable};

/// The package `./scripts/deb.sh --debug` builds.
pub fn deb_path() -> PathBuf {
    let version = env!("CARGO_PKG_VERSION");
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(format!("target/debian/istio-sidecar_{version}_amd64.deb"))
}

/// A fresh Debian root at `root` with the package installed by apt (dependencies resolved, the
/// maintainer scripts run in the root); fails when the package is missing or holds another
/// pilot-agent than target/ (a stale package).
pub fn debian_root(root: &Path) -> Result<()> {
    let deb = deb_path();
    let deb = deb.canonicalize().unwrap_or(deb);
    if !deb.exists() {
        bail!(
            "no {} (build it with ./scripts/deb.sh --debug)",
            deb.display()
        );
    }
    let file = deb.file_name().and_then(|f| f.to_str()).unwrap_or_default();
    let copy_in = format!("--customize-hook=copy-in {} /tmp", deb.display());
    let install = format!(
        "--customize-hook=chroot \"$1\" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq /tmp/{file}"
    );
    let remove = format!("--customize-hook=rm -f \"$1\"/tmp/{file}");
    let root_s = root.to_str().context("VM root path")?;
    run(
        "mmdebstrap",
        &[
            "--quiet",
            "--variant=minbase",
            &copy_in,
            &install,
            &remove,
            "bookworm",
            root_s,
        ],
    )?;
    let installed = fs::read(root.join("usr/local/bin/pilot-agent"))?;
    if installed != fs::read(binary("pilot-agent"))? {
        bail!(
            "{} holds another pilot-agent than target/ (stale: ./scripts/deb.sh --debug)",
            deb.display()
        );
    }
    Ok(())
}

/// A service-account token for `namespace/account` in the shape the API server issues (audience
/// `istio-ca`) that expired an hour ago: as istioctl's token an hour and more after it was made.
/// Unsigned: it fails the control plane's check in any case, what matters is that the agent
/// names its expiry.
pub fn expired_token(namespace: &str, account: &str) -> String {
    use base64::Engine as _;
    let b = |v: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    format!(
        "{}.{}.c2ln",
        b(r#"{"alg":"RS256","typ":"JWT"}"#),
        b(&format!(
            r#"{{"aud":["istio-ca"],"sub":"system:serviceaccount:{namespace}:{account}","iat":{},"exp":{}}}"#,
            now - 7200,
            now - 3600
        ))
    )
}

/// What `istioctl x workload entry configure` writes for one VM.
#[derive(Debug, Clone)]
pub struct GuideFiles {
    pub cluster_env: String,
    pub mesh: String,
    pub root_cert: String,
    pub token: String,
    pub hosts: String,
}

impl GuideFiles {
    /// The files istioctl wrote into `dir` (its `-o`).
    pub fn read(dir: &Path) -> Result<GuideFiles> {
        let read = |f: &str| {
            fs::read_to_string(dir.join(f))
                .with_context(|| format!("{}: no {f} from istioctl", dir.display()))
        };
        Ok(GuideFiles {
            cluster_env: read("cluster.env")?,
            mesh: read("mesh.yaml")?,
            root_cert: read("root-cert.pem")?,
            token: read("istio-token")?,
            hosts: read("hosts")?,
        })
    }
}

/// A VM: its root, its network namespace and the container running the package's start script.
/// Dropping it removes the container.
pub struct Vm {
    pub root: PathBuf,
    /// The network namespace (a name under /run/netns).
    pub netns: String,
    /// The host directory mounted at /var/run/secrets/tokens: /run is a tmpfs on a VM (the
    /// token is placed after boot) and in the container, so a file put in the root's /var/run
    /// would be hidden.
    tokens: PathBuf,
    name: String,
}

impl Vm {
    /// A VM on `root` (made by [`debian_root`]) in network namespace `netns`; `tokens` is a
    /// host directory for the token.
    pub fn new(root: &Path, netns: &str, tokens: &Path) -> Vm {
        Vm {
            root: root.to_path_buf(),
            netns: netns.to_string(),
            tokens: tokens.to_path_buf(),
            name: format!("{netns}-vm"),
        }
    }

    /// Puts the files where Istio's VM guide says: the root certificate in /etc/certs, the
    /// token in /var/run/secrets/tokens, cluster.env in /var/lib/istio/envoy, the mesh config
    /// in /etc/istio/config/mesh, `hosts` appended to /etc/hosts; then `chown -R istio-proxy`
    /// on the agent's directories, as the guide does.
    pub fn place(&self, files: &GuideFiles) -> Result<()> {
        let put = |rel: &str, text: &str| write_readable(&self.root.join(rel), text);
        put("etc/certs/root-cert.pem", &files.root_cert)?;
        put("var/lib/istio/envoy/cluster.env", &files.cluster_env)?;
        put("etc/istio/config/mesh", &files.mesh)?;
        fs::create_dir_all(&self.tokens)?;
        fs::write(self.tokens.join("istio-token"), &files.token)?;
        let hosts = self.root.join("etc/hosts");
        let mut text = fs::read_to_string(&hosts).unwrap_or_default();
        text.push_str(&files.hosts);
        fs::write(&hosts, text)?;
        fs::create_dir_all(self.root.join("etc/istio/proxy"))?;
        for dir in [
            "var/lib/istio",
            "etc/certs",
            "etc/istio/proxy",
            "etc/istio/config",
        ] {
            let path = self.root.join(dir);
            run(
                "chown",
                &["-R", "1337:1337", path.to_str().unwrap_or_default()],
            )?;
        }
        Ok(())
    }

    /// podman's arguments for a container on the root in the VM's namespace running `args`:
    /// detached under the VM's name, or removed when done.
    fn container(&self, detach: bool, args: &[&str]) -> Vec<String> {
        let mut all: Vec<String> = [
            "run",
            "--rootfs",
            "--network",
            &format!("ns:/run/netns/{}", self.netns),
            "--no-hosts",
            "-v",
            &format!("{}:/var/run/secrets/tokens:ro", self.tokens.display()),
            "--cap-add",
            "NET_ADMIN,NET_RAW",
            "--user",
            "0:0",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        if detach {
            all.extend(["-d".into(), "--name".into(), self.name.clone()]);
        } else {
            all.push("--rm".into());
        }
        all.push(self.root.display().to_string());
        all.extend(args.iter().map(|s| s.to_string()));
        all
    }

    /// Starts the unit's ExecStart (`istio-start.sh`) in the background: capture, then the agent.
    pub fn start(&self) -> Result<()> {
        let args = self.container(true, &["/usr/local/bin/istio-start.sh"]);
        podman_ok(&args.iter().map(String::as_str).collect::<Vec<_>>())?;
        Ok(())
    }

    /// Stops the agent as systemd stops the unit (SIGTERM, then SIGKILL after `grace_s`).
    pub fn stop(&self, grace_s: u32) {
        let _ = podman(&["stop", "--time", &grace_s.to_string(), &self.name]);
    }

    /// Starts the stopped unit again (the same container: `systemctl start istio` after a stop).
    pub fn restart(&self) -> Result<()> {
        podman_ok(&["start", &self.name])?;
        Ok(())
    }

    /// Runs `args` in a new container on the root (a command on the VM, as root), to completion.
    pub fn run(&self, args: &[&str]) -> Result<Output> {
        let args = self.container(false, args);
        podman(&args.iter().map(String::as_str).collect::<Vec<_>>())
    }

    /// The VM's token file (on the host).
    pub fn token_file(&self) -> PathBuf {
        self.tokens.join("istio-token")
    }

    /// Empties the agent's log files (while it is stopped): each step reads only its own.
    pub fn clear_logs(&self) {
        for f in ["istio.log", "istio.err.log"] {
            let _ = fs::write(self.root.join("var/log/istio").join(f), "");
        }
    }

    /// The agent's logs where istio-start.sh sends them.
    pub fn logs(&self) -> String {
        let read = |f: &str| {
            fs::read_to_string(self.root.join("var/log/istio").join(f)).unwrap_or_default()
        };
        format!(
            "VM istio.log:\n{}\nVM istio.err.log:\n{}",
            crate::tail(&read("istio.log"), 60),
            crate::tail(&read("istio.err.log"), 60)
        )
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        let _ = podman(&["rm", "--force", "--time", "0", &self.name]);
    }
}
