//! A pod's network: the sandbox made by `harness::sandbox` on the node's bridge, its sysctls,
//! and the `/etc/hosts` and `resolv.conf` that stand in for cluster DNS.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use anyhow::{Context, Result};

use k8s_openapi::api::core::v1::Pod;

use harness::sandbox as netns;

use super::*;

/// The pod's network: a namespace on the node's bridge (`cbr0`) with the pod's address and a
/// default route through the node, `/etc/hosts` and `resolv.conf`, the pod's sysctls.
pub(super) async fn sandbox(inner: &Inner, run: &PodRun, pod: &Pod) -> Result<()> {
    fs::create_dir_all(&run.dir)?;
    fs::set_permissions(&run.dir, fs::Permissions::from_mode(0o755))?;
    let link = format!("vp{}", inner.next_link.fetch_add(1, Ordering::SeqCst));
    let ns = run.netns.clone();
    let addresses = [format!("{}/24", run.ip)];
    let hosts = hosts_for(inner, run);
    let resolv = format!(
        "search {}.svc.cluster.local svc.cluster.local cluster.local\nnameserver {NODE_IP}\noptions ndots:5\n",
        run.namespace
    );
    let sysctls = pod
        .spec
        .as_ref()
        .and_then(|s| s.security_context.as_ref())
        .and_then(|s| s.sysctls.clone())
        .unwrap_or_default();
    tokio::task::spawn_blocking(move || -> Result<()> {
        netns::write_etc(&ns, "hosts", hosts.as_bytes())?;
        netns::write_etc(&ns, "resolv.conf", resolv.as_bytes())?;
        netns::create(&netns::Spec {
            netns: &ns,
            bridge: netns::Bridge {
                netns: None,
                name: "cbr0",
            },
            link: &link,
            addresses: &addresses,
            routes: &[netns::Route {
                dest: "default",
                via: Some(NODE_IP),
            }],
        })
        .context("sandbox")?;
        for s in sysctls {
            netns::set_sysctl(&ns, &s.name, &s.value)
                .with_context(|| format!("spec.securityContext.sysctls {}", s.name))?;
        }
        Ok(())
    })
    .await?
}

pub(super) fn hosts_for(inner: &Inner, run: &PodRun) -> String {
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
pub(super) fn refresh_hosts(inner: &Inner) {
    let runs: Vec<Arc<PodRun>> = {
        let pods = lock(&inner.pods);
        pods.values().map(|p| p.run.clone()).collect()
    };
    for run in runs {
        let path = netns::etc_path(&run.netns, "hosts");
        if path.exists() {
            let _ = fs::write(&path, hosts_for(inner, &run));
        }
    }
}
