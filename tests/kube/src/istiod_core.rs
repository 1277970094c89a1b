//! istiod-core as the cluster's only control plane: the cluster holds Istio's install as
//! `istioctl manifest generate` renders it (CRDs, RBAC, the `istio` mesh and
//! `istio-sidecar-injector` ConfigMaps, the istiod Service), minus every webhook (no injector
//! or validation server runs), and `istiod-core serve --kubeconfig` runs on the node's host
//! network with the env istiod's Deployment gives, serving xDS and the CA on 15012 and its
//! debug endpoints on 15014 as istiod does. As istiod, it keeps its CA root in the cluster (Secret
//! `istio-ca-secret`), publishes it as ConfigMap `istio-ca-root-cert` in every namespace and
//! authenticates sidecars by a TokenReview of their tokens. Pods get their sidecars from Istio's own injector
//! offline, `istioctl kube-inject` fed the injector's ConfigMaps ([`kube_inject`]).

use std::fs;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;

use crate::cluster::Cluster;
use crate::http::http_probe;
use crate::istio::{self, Manifest};

/// istiod's secure xDS + CA port, where the injected sidecars look for
/// `istiod.istio-system.svc`.
pub const GRPC_PORT: u16 = 15012;
/// istiod's monitoring port; istiod-core serves `/debug/*` there.
pub const DEBUG_PORT: u16 = 15014;

/// How istiod-core runs: its command line, the env istiod's Deployment would give it, and the
/// install the cluster holds.
pub struct IstiodCore {
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: PathBuf,
    pub manifest: Manifest,
}

/// Applies Istio's install without its webhooks and istiod, then starts istiod-core on the node
/// and waits until it serves.
pub fn install(cluster: &mut Cluster, extra: &[&str]) -> Result<IstiodCore> {
    let manifest = Manifest::render(cluster, extra)?;
    manifest.apply(cluster, &["MutatingWebhookConfiguration"])?;
    cluster
        .kubelet
        .host_network_service("istio-system", "istiod");
    let client = cluster.client.clone();
    let deployment = manifest.object("Deployment", "istiod")?;
    let (_, env) = cluster.block_on(istio::deployment_env(&client, deployment, "discovery"))?;
    let cwd = cluster.dir.join("istiod-core");
    fs::create_dir_all(&cwd)?;
    let args = vec![
        harness::binary("istiod-core").display().to_string(),
        "serve".into(),
        "--kubeconfig".into(),
        cluster.kubeconfig.display().to_string(),
        "--grpc-addr".into(),
        format!("0.0.0.0:{GRPC_PORT}"),
        "--debug-addr".into(),
        format!("0.0.0.0:{DEBUG_PORT}"),
    ];
    let core = IstiodCore {
        args,
        env,
        cwd,
        manifest,
    };
    core.start(cluster)?;
    Ok(core)
}

impl IstiodCore {
    /// Starts istiod-core (the cluster's component "istiod-core") and waits until it accepts
    /// connections on 15012 and answers `/debug/syncz` on 15014.
    pub fn start(&self, cluster: &mut Cluster) -> Result<()> {
        let log = cluster.logs_dir().join("istiod-core.log");
        let env: Vec<(String, String)> = self
            .env
            .iter()
            .cloned()
            .chain([("RUST_LOG".to_string(), "info".to_string())])
            .collect();
        let p = harness::Proc::start("istiod-core", &self.args, &env, &self.cwd, &log)?;
        cluster.adopt(p);
        let started = Instant::now();
        let serving = cluster.block_on(async {
            let deadline = Instant::now() + Duration::from_secs(60);
            while Instant::now() < deadline {
                let grpc = tokio::net::TcpStream::connect(("127.0.0.1", GRPC_PORT))
                    .await
                    .is_ok();
                if grpc
                    && http_probe(
                        "127.0.0.1",
                        DEBUG_PORT,
                        "/debug/syncz",
                        &[],
                        Duration::from_secs(1),
                    )
                    .await
                    .is_ok_and(|c| c == 200)
                {
                    return true;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            false
        });
        if !serving {
            let logs = cluster
                .component("istiod-core")
                .map(|c| c.logs())
                .unwrap_or_default();
            bail!(
                "istiod-core not serving on {GRPC_PORT} and {DEBUG_PORT} in 60 s:\n{}",
                harness::tail(&logs, 40)
            );
        }
        eprintln!(
            "istiod-core serving in {:.2} s",
            started.elapsed().as_secs_f64()
        );
        Ok(())
    }

    /// istiod-core's `/debug/*` endpoint `path` (JSON).
    pub fn debug(&self, cluster: &Cluster, path: &str) -> Result<serde_json::Value> {
        let text = cluster.block_on(crate::http::http_get_text("127.0.0.1", DEBUG_PORT, path))?;
        serde_json::from_str(&text).with_context(|| format!("{path}: not JSON: {text}"))
    }

    /// Every rejection a connected proxy sent (`/debug/syncz`): proxy, type and error.
    pub fn nacks(&self, cluster: &Cluster) -> Result<Vec<String>> {
        let syncz = self.debug(cluster, "/debug/syncz")?;
        let mut out = Vec::new();
        for proxy in syncz.as_array().into_iter().flatten() {
            let id = proxy["proxy"].as_str().unwrap_or_default();
            for (type_url, sync) in proxy["types"].as_object().into_iter().flatten() {
                if let Some(error) = sync["nacked"].as_str() {
                    out.push(format!("{id} {type_url}: {error}"));
                }
            }
        }
        Ok(out)
    }

    /// The proxies connected now (`/debug/syncz`).
    pub fn proxies(&self, cluster: &Cluster) -> Result<Vec<String>> {
        let syncz = self.debug(cluster, "/debug/syncz")?;
        Ok(syncz
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| p["proxy"].as_str().map(str::to_string))
            .collect())
    }
}

/// `istioctl kube-inject` of `yaml` as a user runs it when istiod-core is the control plane:
/// the injector's template and values and the mesh config taken from the cluster's
/// `istio-sidecar-injector` and `istio` ConfigMaps (`kubectl get cm -o jsonpath`) into files,
/// and the cluster's kubeconfig. Returns the injected objects (YAML).
pub fn kube_inject(cluster: &Cluster, yaml: &str) -> Result<String> {
    let dir = cluster.dir.join("kube-inject");
    fs::create_dir_all(&dir)?;
    let api: Api<ConfigMap> = Api::namespaced(cluster.client.clone(), "istio-system");
    let files = [
        ("istio-sidecar-injector", "config", "inject-config.yaml"),
        ("istio-sidecar-injector", "values", "inject-values.json"),
        ("istio", "mesh", "mesh.yaml"),
    ];
    for (name, key, file) in files {
        let cm = cluster
            .block_on(api.get(name))
            .with_context(|| format!("ConfigMap istio-system/{name}"))?;
        let value = cm
            .data
            .and_then(|d| d.get(key).cloned())
            .with_context(|| format!("ConfigMap istio-system/{name} has no {key}"))?;
        fs::write(dir.join(file), value)?;
    }
    let input = dir.join("in.yaml");
    let output = dir.join("out.yaml");
    fs::write(&input, yaml)?;
    let _ = fs::remove_file(&output);
    let path = |f: &str| dir.join(f).display().to_string();
    let out = crate::istioctl::run(
        cluster,
        &[
            "kube-inject",
            "--injectConfigFile",
            &path("inject-config.yaml"),
            "--valuesFile",
            &path("inject-values.json"),
            "--meshConfigFile",
            &path("mesh.yaml"),
            "-f",
            &input.display().to_string(),
            "-o",
            &output.display().to_string(),
        ],
    )?;
    if !out.success {
        bail!("istioctl kube-inject: {}", out.stderr);
    }
    fs::read_to_string(&output).context("istioctl kube-inject wrote no output")
}
