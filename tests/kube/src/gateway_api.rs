//! The Kubernetes Gateway API on the test cluster: its CRDs as published, the cluster's
//! load-balancer controller (no cloud gives a gateway Service an address here), and the upstream
//! conformance suite run unmodified against it (`scripts/install-gateway-conformance.sh`
//! installs all three pieces).
//!
//! The load balancer: a Service of type LoadBalancer gets, as `status.loadBalancer.ingress`, the
//! address of one Ready pod it selects. The pod serves the Service's ports itself (a gateway's
//! listener ports are its Service's target ports), so traffic to the address is traffic to the
//! gateway, as a cloud's pass-through load balancer would deliver it.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::Value;

use crate::apply;
use crate::cluster::Cluster;
pub use crate::installs::{VERSION, home, installed};

/// Applies the Gateway API CRDs of `channel` (`standard` or `experimental`) and waits until the
/// API server serves them.
pub fn install_crds(cluster: &Cluster, channel: &str) -> Result<()> {
    let dir = installed(&format!("crd/{channel}"))?;
    let mut files: Vec<PathBuf> = fs::read_dir(&dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    let mut objects = Vec::new();
    for f in &files {
        let text = fs::read_to_string(f).with_context(|| format!("read {}", f.display()))?;
        objects.extend(apply::parse_objects(&text).with_context(|| format!("{}", f.display()))?);
    }
    let client = cluster.client.clone();
    cluster.block_on(apply::apply_all(&client, &objects, None))
}

/// Starts the cluster's load-balancer controller (see the module's doc) on the cluster's runtime;
/// it runs until the cluster stops.
pub fn start_load_balancer(cluster: &Cluster) {
    let client = cluster.client.clone();
    cluster.handle().spawn(async move {
        let mut last_error = String::new();
        loop {
            match assign_addresses(&client).await {
                // Said once per distinct error (the API server stops before this task does).
                Err(e) if format!("{e:#}") != last_error => {
                    last_error = format!("{e:#}");
                    eprintln!("load balancer: {last_error}");
                }
                Err(_) => {}
                Ok(()) => last_error.clear(),
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    });
}

/// One pass: every LoadBalancer Service whose ingress is not the address of a Ready pod it
/// selects gets one (or none, when no such pod is left).
async fn assign_addresses(client: &kube::Client) -> Result<()> {
    let services: Api<Service> = Api::all(client.clone());
    let pods: Api<Pod> = Api::all(client.clone());
    let all_pods = pods.list(&ListParams::default()).await?;
    for svc in services.list(&ListParams::default()).await? {
        let Some(spec) = &svc.spec else { continue };
        if spec.type_.as_deref() != Some("LoadBalancer") {
            continue;
        }
        let ns = svc.metadata.namespace.clone().unwrap_or_default();
        let name = svc.metadata.name.clone().unwrap_or_default();
        let selector = spec.selector.clone().unwrap_or_default();
        let ready_ips: Vec<String> = all_pods
            .iter()
            .filter(|p| p.metadata.namespace.as_deref() == Some(ns.as_str()))
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter(|p| !selector.is_empty() && selects(&selector, p))
            .filter(|p| pod_ready(p))
            .filter_map(|p| p.status.as_ref().and_then(|s| s.pod_ip.clone()))
            .collect();
        let current: Vec<String> = svc
            .status
            .as_ref()
            .and_then(|s| s.load_balancer.as_ref())
            .and_then(|lb| lb.ingress.as_ref())
            .map(|i| i.iter().filter_map(|x| x.ip.clone()).collect())
            .unwrap_or_default();
        let want: Vec<String> = match current.first() {
            Some(ip) if ready_ips.contains(ip) => continue,
            _ => ready_ips.into_iter().take(1).collect(),
        };
        if want == current {
            continue;
        }
        let ingress: Vec<Value> = want
            .iter()
            .map(|ip| serde_json::json!({"ip": ip, "ipMode": "VIP"}))
            .collect();
        let api: Api<Service> = Api::namespaced(client.clone(), &ns);
        api.patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"status": {"loadBalancer": {"ingress": ingress}}})),
        )
        .await
        .with_context(|| format!("set the load-balancer address of Service {ns}/{name}"))?;
    }
    Ok(())
}

fn selects(selector: &BTreeMap<String, String>, pod: &Pod) -> bool {
    let labels = pod.metadata.labels.clone().unwrap_or_default();
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// How the suite runs: its flags (the suite's own, e.g. `-gateway-class=istio`) and the
/// `go test` selection of tests (`-test.run`).
pub struct SuiteRun {
    pub flags: Vec<String>,
    pub run: Option<String>,
    pub timeout: Duration,
}

/// What a run left: the report the suite wrote (`-report-output`), its output and whether
/// `go test` passed.
pub struct SuiteResult {
    pub passed: bool,
    pub report: String,
    pub output: String,
    /// Per test: (name, "PASS" | "FAIL" | "SKIP").
    pub tests: Vec<(String, String)>,
}

/// Runs the installed suite against `cluster` (its kubeconfig; the calling thread is in the
/// node's network namespace, so gateway addresses on the pod bridge are reachable), writing the
/// report to `report` and the output beside it.
pub fn run_suite(cluster: &Cluster, suite: &SuiteRun, report: &Path) -> Result<SuiteResult> {
    let bin = installed("bin/conformance.test")?;
    let out_path = report.with_extension("log");
    let out_file = fs::File::create(&out_path)?;
    let mut cmd = Command::new(&bin);
    cmd.arg("-test.v")
        .arg(format!("-test.timeout={}s", suite.timeout.as_secs()))
        .args(suite.run.iter().map(|r| format!("-test.run={r}")))
        .args(&suite.flags)
        .arg(format!("-report-output={}", report.display()))
        .env("KUBECONFIG", &cluster.kubeconfig)
        .current_dir(report.parent().unwrap_or(Path::new(".")))
        .stdin(Stdio::null())
        .stdout(out_file.try_clone()?)
        .stderr(out_file);
    eprintln!(
        "gateway conformance: running {} (output in {})",
        bin.display(),
        out_path.display()
    );
    let status = cmd.status().context("run the conformance suite")?;
    let output = fs::read_to_string(&out_path).unwrap_or_default();
    let report_text = fs::read_to_string(report).unwrap_or_default();
    Ok(SuiteResult {
        passed: status.success(),
        tests: test_results(&output),
        report: report_text,
        output,
    })
}

/// The `--- PASS|FAIL|SKIP: TestConformance/NAME` lines of `go test -v` output (only the
/// suite's tests, not their subtests).
pub fn test_results(output: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for line in output.lines() {
        let t = line.trim_start();
        for verdict in ["PASS", "FAIL", "SKIP"] {
            let Some(rest) = t.strip_prefix(&format!("--- {verdict}: TestConformance/")) else {
                continue;
            };
            let name = rest.split_whitespace().next().unwrap_or_default();
            if !name.contains('/') {
                out.push((name.to_string(), verdict.to_string()));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_are_read_from_go_test_output() {
        let out = "=== RUN   TestConformance\n    --- PASS: TestConformance/HTTPRouteSimpleSameNamespace (1.20s)\n        --- PASS: TestConformance/HTTPRouteSimpleSameNamespace/sub (0.1s)\n    --- FAIL: TestConformance/GatewayModifyListeners (30.00s)\n    --- SKIP: TestConformance/UDPRoute (0.00s)\n--- FAIL: TestConformance (60.00s)\n";
        assert_eq!(
            test_results(out),
            [
                (
                    "HTTPRouteSimpleSameNamespace".to_string(),
                    "PASS".to_string()
                ),
                ("GatewayModifyListeners".to_string(), "FAIL".to_string()),
                ("UDPRoute".to_string(), "SKIP".to_string()),
            ]
        );
    }
}
