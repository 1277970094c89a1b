//! The Envoy process: command line as Istio's `pkg/envoy/proxy.go` builds it, started as the
//! proxy uid/gid when the agent runs as root, drained and stopped on shutdown.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};

use crate::config::Config;

#[derive(Debug, thiserror::Error)]
pub enum EnvoyError {
    #[error(
        "cannot start Envoy {binary}: {source} (is Envoy installed? ProxyConfig.binaryPath sets its path)"
    )]
    Spawn {
        binary: String,
        source: std::io::Error,
    },
}

/// Envoy's arguments for `cfg`.
pub fn args(cfg: &Config, bootstrap: &Path) -> Vec<String> {
    let ip_version = match cfg.instance_ips.first() {
        Some(std::net::IpAddr::V6(_)) => "v6",
        _ => "v4",
    };
    let mut a: Vec<String> = vec![
        "-c".into(),
        bootstrap.display().to_string(),
        "--drain-time-s".into(),
        cfg.drain_duration.as_secs().to_string(),
        "--drain-strategy".into(),
        "immediate".into(),
        "--local-address-ip-version".into(),
        ip_version.into(),
        "--file-flush-interval-msec".into(),
        "1000".into(),
        "--disable-hot-restart".into(),
        "--allow-unknown-static-fields".into(),
    ];
    // `--proxyLogLevel` accepts `level` or `level,comp:level,...`.
    let mut levels = cfg.proxy_log_level.split(',');
    if let Some(level) = levels.next().filter(|l| !l.is_empty()) {
        a.extend(["-l".into(), level.to_string()]);
    }
    let components: Vec<&str> = levels
        .chain(cfg.proxy_component_log_level.split(','))
        .filter(|c| !c.is_empty())
        .collect();
    if !components.is_empty() {
        a.extend(["--component-log-level".into(), components.join(",")]);
    }
    a.push("--skip-deprecated-logs".into());
    if let Some(c) = cfg.concurrency {
        a.extend(["--concurrency".into(), c.to_string()]);
    }
    a
}

/// Starts Envoy. As root, Envoy runs as `cfg.envoy_uid` (gid the same, supplementary groups
/// cleared), as in Kubernetes where the proxy container runs as 1337.
pub fn spawn(cfg: &Config, bootstrap: &Path) -> Result<Child, EnvoyError> {
    let mut cmd = Command::new(&cfg.binary_path);
    cmd.args(args(cfg, bootstrap))
        .stdin(Stdio::null())
        .kill_on_drop(true);
    if nix::unistd::geteuid().is_root() {
        cmd.uid(cfg.envoy_uid).gid(cfg.envoy_uid);
    }
    tracing::info!(binary = %cfg.binary_path.display(), args = ?args(cfg, bootstrap), "starting Envoy");
    cmd.spawn().map_err(|source| EnvoyError::Spawn {
        binary: cfg.binary_path.display().to_string(),
        source,
    })
}

/// Istio's sidecar shutdown: drain inbound listeners gracefully, wait the termination drain
/// duration, then stop Envoy.
pub async fn drain_and_stop(child: &mut Child, admin_port: u16, drain: Duration) {
    let drained = crate::admin::post(admin_port, "/drain_listeners?inboundonly&graceful").await;
    if let Err(e) = drained {
        tracing::warn!(error = %e, "could not ask Envoy to drain");
    }
    tokio::select! {
        _ = tokio::time::sleep(drain) => {}
        _ = child.wait() => return,
    }
    if let Err(e) = child.kill().await {
        tracing::warn!(error = %e, "could not stop Envoy");
    }
}
