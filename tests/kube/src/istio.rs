//! Istio as its users install it: the installed `istioctl` renders the install, pointing the
//! proxy image at ours; the test applies what a cluster holds of it (CRDs, RBAC, the mesh and
//! injector ConfigMaps, the istiod Service, the MutatingWebhookConfiguration whose URL reaches
//! this istiod) and runs the installed `pilot-discovery` with its Deployment's args and env on
//! the node's host network.

use std::fs;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{Container, Pod};
use kube::api::Api;
use serde_json::Value;

use crate::apply;
use crate::cluster::Cluster;
use crate::http::http_probe;
use crate::images::{PROXY_HUB, PROXY_TAG};
use crate::kubelet::volumes;

/// The webhook URL the install is rendered with: the API server reaches istiod on the node's
/// loopback (no Service routing without kube-proxy).
pub const INJECTION_URL: &str = "https://localhost:15017/inject";

/// How istiod runs: its Deployment's command line and env, resolved.
pub struct Istiod {
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: PathBuf,
    /// The rendered install (`istioctl manifest generate`).
    pub manifest: String,
}

/// The `istioctl manifest generate` flags of the install: the minimal profile (istiod only),
/// the webhook URL, our proxy image, and `extra` (`--set` values of the test).
pub fn manifest_args(extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = [
        "manifest",
        "generate",
        "--set",
        "profile=minimal",
        "--set",
        &format!("values.istiodRemote.injectionURL={INJECTION_URL}"),
        "--set",
        &format!("values.global.hub={PROXY_HUB}"),
        "--set",
        &format!("values.global.tag={PROXY_TAG}"),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for e in extra {
        args.push("--set".into());
        args.push(e.to_string());
    }
    args
}

/// Istio's install as `istioctl manifest generate` renders it (`manifest_args`).
pub struct Manifest {
    pub text: String,
    pub objects: Vec<Value>,
}

impl Manifest {
    /// Runs the installed istioctl; the text is kept as `istio-manifest.yaml` in the cluster's
    /// directory.
    pub fn render(cluster: &Cluster, extra: &[&str]) -> Result<Manifest> {
        let istioctl = harness::istio::istio_bin("istioctl")?;
        let out = std::process::Command::new(&istioctl)
            .args(manifest_args(extra))
            .output()
            .context("run istioctl manifest generate")?;
        if !out.status.success() {
            bail!(
                "istioctl manifest generate: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let text = String::from_utf8(out.stdout)?;
        fs::write(cluster.dir.join("istio-manifest.yaml"), &text)?;
        let objects = apply::parse_objects(&text)?;
        Ok(Manifest { text, objects })
    }

    /// The rendered object of `kind` named `name`.
    pub fn object(&self, kind: &str, name: &str) -> Result<&Value> {
        self.objects
            .iter()
            .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
            .with_context(|| format!("the rendered install has no {kind} {name}"))
    }

    /// Value `key` of the rendered ConfigMap `name`.
    pub fn config_map_data(&self, name: &str, key: &str) -> Result<&str> {
        self.object("ConfigMap", name)?["data"][key]
            .as_str()
            .with_context(|| format!("ConfigMap {name} has no {key}"))
    }

    /// Applies what a cluster holds of the install: the istio-system namespace, then every
    /// object but those of kinds in `skip`, and never what runs istiod (this test runs it: the
    /// Deployment's pod would be istiod itself, with its HPA and PDB) nor the validating webhook
    /// (it names the istiod Service, which the API server cannot reach).
    pub fn apply(&self, cluster: &Cluster, skip: &[&str]) -> Result<()> {
        let skipped = |o: &Value| {
            let kind = o["kind"].as_str().unwrap_or_default();
            skip.contains(&kind)
                || matches!(
                    kind,
                    "Deployment"
                        | "HorizontalPodAutoscaler"
                        | "PodDisruptionBudget"
                        | "ValidatingWebhookConfiguration"
                )
        };
        let keep: Vec<Value> = self
            .objects
            .iter()
            .filter(|o| !skipped(o))
            .cloned()
            .collect();
        let namespace = serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "istio-system"}});
        let client = cluster.client.clone();
        cluster.block_on(async {
            apply::apply_object(&client, &namespace, None).await?;
            apply::apply_all(&client, &keep, Some("istio-system")).await
        })
    }
}

/// Renders and applies the install, then starts istiod and waits until it is ready and has
/// given the injector webhook its CA.
pub fn install(cluster: &mut Cluster, extra: &[&str]) -> Result<Istiod> {
    let manifest = Manifest::render(cluster, extra)?;
    manifest.apply(cluster, &[])?;
    let deployment = manifest.object("Deployment", "istiod")?.clone();
    let client = cluster.client.clone();
    cluster
        .kubelet
        .host_network_service("istio-system", "istiod");
    let istiod = cluster.block_on(istiod_from(
        &client,
        &deployment,
        cluster.dir.join("istiod"),
        &cluster.kubeconfig,
    ))?;
    let istiod = Istiod {
        manifest: manifest.text,
        ..istiod
    };
    istiod.start(cluster)?;
    Ok(istiod)
}

/// The container `name` of a rendered Deployment and the env its pod would give it (the
/// downward API resolved for a pod `POD_NAME` on the node, with the node's address).
pub async fn deployment_env(
    client: &kube::Client,
    deployment: &Value,
    name: &str,
) -> Result<(Container, Vec<(String, String)>)> {
    let template = &deployment["spec"]["template"];
    let container: Container = serde_json::from_value(
        template["spec"]["containers"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["name"] == name))
            .cloned()
            .with_context(|| format!("Deployment without its {name} container"))?,
    )?;
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": POD_NAME, "namespace": "istio-system", "labels": template["metadata"]["labels"]},
        "spec": {
            "serviceAccountName": template["spec"]["serviceAccountName"],
            "nodeName": crate::node::NODE_NAME,
            "containers": [],
        },
        "status": {"podIP": crate::node::NODE_IP, "hostIP": crate::node::NODE_IP},
    }))?;
    let env = volumes::container_env(client, &pod, &container, "istiod Deployment").await?;
    Ok((container, env))
}

/// The name of the pod the istiod Deployment would make, in its env.
pub const POD_NAME: &str = "istiod-0";

async fn istiod_from(
    client: &kube::Client,
    deployment: &Value,
    cwd: PathBuf,
    kubeconfig: &std::path::Path,
) -> Result<Istiod> {
    let (container, mut env) = deployment_env(client, deployment, "discovery").await?;
    // Its serving certificate must name the host the API server calls the webhook at.
    env.push(("ISTIOD_CUSTOM_HOST".into(), "localhost".into()));
    let mut args = vec![
        harness::istio::istio_bin("pilot-discovery")?
            .display()
            .to_string(),
    ];
    args.extend(container.args.iter().flatten().cloned());
    args.push(format!("--kubeconfig={}", kubeconfig.display()));
    fs::create_dir_all(&cwd)?;
    Ok(Istiod {
        args,
        env,
        cwd,
        manifest: String::new(),
    })
}

impl Istiod {
    /// Starts istiod (as the cluster's component "istiod") and waits for it to be ready and to
    /// have written its CA into the injector webhook.
    pub fn start(&self, cluster: &mut Cluster) -> Result<()> {
        let log = cluster.logs_dir().join("istiod.log");
        let c = harness::Proc::start("istiod", &self.args, &self.env, &self.cwd, &log)?;
        cluster.adopt(c);
        let started = Instant::now();
        let client = cluster.client.clone();
        let ok = cluster.block_on(async {
            let deadline = Instant::now() + Duration::from_secs(120);
            while Instant::now() < deadline {
                if http_probe("127.0.0.1", 8080, "/ready", &[], Duration::from_secs(1))
                    .await
                    .is_ok_and(|c| c == 200)
                    && webhook_has_ca(&client).await
                {
                    return true;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            false
        });
        if !ok {
            let logs = cluster
                .component("istiod")
                .map(|c| c.logs())
                .unwrap_or_default();
            bail!("istiod not ready in 120 s:\n{}", harness::tail(&logs, 40));
        }
        eprintln!("istiod ready in {:.1} s", started.elapsed().as_secs_f64());
        Ok(())
    }

    /// Stops istiod (SIGTERM, as its pod would be stopped) and starts it again.
    pub fn restart(&self, cluster: &mut Cluster) -> Result<()> {
        if let Some(old) = cluster.stop_component("istiod", Duration::from_secs(10)) {
            let prev = cluster.logs_dir().join("istiod.previous.log");
            let _ = fs::copy(&old.log, prev);
        }
        self.start(cluster)
    }
}

async fn webhook_has_ca(client: &kube::Client) -> bool {
    let api: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    api.get_opt("istio-sidecar-injector")
        .await
        .ok()
        .flatten()
        .and_then(|w| w.webhooks)
        .is_some_and(|hooks| {
            !hooks.is_empty()
                && hooks.iter().all(|h| {
                    h.client_config
                        .ca_bundle
                        .as_ref()
                        .is_some_and(|b| !b.0.is_empty())
                })
        })
}
