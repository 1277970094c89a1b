//! Istio's own `istioctl` (the release-1.31 build `scripts/install-istio.sh` installs) run as
//! Istio's users debug a mesh: `proxy-status` against the control plane's xDS port,
//! `proxy-config` on a sidecar's Envoy config dump, and the same `proxy-config` on what Istio's
//! istiod 1.31 sent the same sidecar (`tests/fixtures/istiod-1.31/bookinfo-productpage`) to
//! compare the two.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::Cluster;
use crate::bookinfo::pod_local;

/// The longest one istioctl command may take (`kube-inject` retries an API server it cannot
/// reach).
const LIMIT: Duration = Duration::from_secs(60);

/// What one istioctl run printed.
#[derive(Debug)]
pub struct Output {
    pub success: bool,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `istioctl ARGS --kubeconfig K` (in the cluster's network: the test's thread is in it),
/// bounded by `LIMIT`.
pub fn run(c: &Cluster, args: &[&str]) -> Result<Output> {
    let dir = c.dir.join("istioctl");
    fs::create_dir_all(&dir)?;
    let (out, err) = (dir.join("stdout.txt"), dir.join("stderr.txt"));
    let mut child = Command::new(harness::istio::istio_bin("istioctl")?)
        .args(args)
        .arg("--kubeconfig")
        .arg(&c.kubeconfig)
        // `bug-report` has a `--kubeconfig` of its own and looks the control plane's versions
        // up through the root command's client, which reads only the environment.
        .env("KUBECONFIG", &c.kubeconfig)
        .stdin(Stdio::null())
        .stdout(fs::File::create(&out)?)
        .stderr(fs::File::create(&err)?)
        .spawn()
        .context("run istioctl")?;
    let deadline = Instant::now() + LIMIT;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!("istioctl {args:?} still running after {LIMIT:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Ok(Output {
        success: status.success(),
        stdout: fs::read_to_string(&out)?,
        stderr: fs::read_to_string(&err)?,
    })
}

/// `run`, failing unless istioctl exits 0; its standard output.
pub fn ok(c: &Cluster, args: &[&str]) -> Result<String> {
    let out = run(c, args)?;
    if !out.success {
        bail!("istioctl {args:?} failed:\n{}{}", out.stdout, out.stderr);
    }
    Ok(out.stdout)
}

/// The rows of an istioctl table: each line's columns (split on runs of two or more spaces,
/// as its tabwriter pads them), the header first.
pub fn table(text: &str) -> Vec<Vec<String>> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            l.split("  ")
                .map(str::trim)
                .filter(|c| !c.is_empty())
                .map(str::to_string)
                .collect()
        })
        .collect()
}

/// Writes what a pod's Envoy serves on its admin port at `path` (`config_dump`,
/// `clusters?format=json`) to a file under the cluster's directory, for `--file`.
pub fn admin_file(c: &Cluster, namespace: &str, pod: &str, path: &str) -> Result<PathBuf> {
    let text = pod_local(c, namespace, pod, &format!("http://127.0.0.1:15000/{path}"))?;
    serde_json::from_str::<serde_json::Value>(&text)
        .with_context(|| format!("{pod} /{path}: not JSON: {}", harness::tail(&text, 5)))?;
    let dir = c.dir.join("istioctl");
    fs::create_dir_all(&dir)?;
    let file = dir.join(format!(
        "{pod}-{}.json",
        path.split('?').next().unwrap_or(path)
    ));
    fs::write(&file, text)?;
    Ok(file)
}

/// An Envoy config dump made of what Istio's istiod 1.31 sent Bookinfo's productpage sidecar
/// (the recorded CDS, LDS and RDS responses), for `proxy-config --file`.
pub fn istiod_dump(dir: &Path) -> Result<PathBuf> {
    let read = crate::bookinfo::istiod_recorded;
    let dump = serde_json::json!({"configs": [
        {"@type": "type.googleapis.com/envoy.admin.v3.ClustersConfigDump",
         "dynamic_active_clusters": read("cds.json")?.into_iter()
            .map(|c| serde_json::json!({"cluster": c})).collect::<Vec<_>>()},
        {"@type": "type.googleapis.com/envoy.admin.v3.ListenersConfigDump",
         "dynamic_listeners": read("lds.json")?.into_iter()
            .map(|l| serde_json::json!({"name": l["name"], "active_state": {"listener": l}}))
            .collect::<Vec<_>>()},
        {"@type": "type.googleapis.com/envoy.admin.v3.RoutesConfigDump",
         "dynamic_route_configs": read("rds.json")?.into_iter()
            .map(|r| serde_json::json!({"route_config": r})).collect::<Vec<_>>()},
    ]});
    fs::create_dir_all(dir)?;
    let file = dir.join("istiod-1.31-productpage-config_dump.json");
    fs::write(&file, serde_json::to_vec_pretty(&dump)?)?;
    Ok(file)
}

/// The rows of `istioctl proxy-config KIND --file F` (header left out), as lines of their
/// columns joined by a single space.
pub fn proxy_config_rows(c: &Cluster, kind: &str, file: &Path) -> Result<BTreeSet<String>> {
    let file = file.display().to_string();
    Ok(rows(&ok(c, &["proxy-config", kind, "--file", &file])?))
}

/// The rows of `istioctl proxy-config KIND POD.NAMESPACE` (the pod's admin port reached through
/// the API server's `pods/portforward`), as [`proxy_config_rows`] gives them.
pub fn proxy_config_rows_of(c: &Cluster, kind: &str, pod: &str) -> Result<BTreeSet<String>> {
    Ok(rows(&ok(c, &["proxy-config", kind, pod])?))
}

/// A table's rows but its header, each its columns joined by a single space.
fn rows(out: &str) -> BTreeSet<String> {
    table(out)
        .into_iter()
        .skip(1)
        .map(|cols| cols.join(" "))
        .collect()
}

/// `istioctl bug-report` over the whole cluster (its default namespaces) with `extra` flags,
/// bounded by `LIMIT`; the archive it writes, unpacked: the directory `bug-report/` holds
/// (`cluster/`, `proxies/NS/POD/`, `bug-report.log`, ...). Its standard output comes back too.
pub fn bug_report(c: &Cluster, extra: &[&str]) -> Result<(PathBuf, String)> {
    let dir = c.dir.join("bug-report");
    if dir.exists() {
        fs::remove_dir_all(&dir)?;
    }
    fs::create_dir_all(&dir)?;
    let dir_arg = dir.display().to_string();
    let mut args = vec!["bug-report", "--output-dir", &dir_arg, "--timeout", "50s"];
    args.extend_from_slice(extra);
    let out = ok(c, &args)?;
    let archive = dir.join("bug-report.tar.gz");
    let status = Command::new("tar")
        .arg("-xzf")
        .arg(&archive)
        .arg("-C")
        .arg(&dir)
        .status()
        .context("run tar")?;
    if !status.success() {
        bail!("tar -xzf {}: {status}", archive.display());
    }
    Ok((dir.join("bug-report"), out))
}
