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
    let f = &cfg.features;
    // Istio 1.31's order (`pkg/envoy/proxy.go`); `--parent-shutdown-time-s` is no longer passed.
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
        f.file_flush_interval.as_millis().to_string(),
        "--disable-hot-restart".into(),
        "--allow-unknown-static-fields".into(),
    ];
    if let Some(kb) = f.file_flush_min_size_kb {
        a.extend(["--file-flush-min-size-kb".into(), kb.to_string()]);
    }
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
    if f.skip_deprecated_logs {
        a.push("--skip-deprecated-logs".into());
    }
    if f.enable_core_dump {
        a.push("--enable-core-dump".into());
    }
    if let Some(o) = &cfg.bootstrap_override {
        a.extend(["--config-yaml".into(), o.to_string()]);
    }
    if let Some(c) = cfg.concurrency {
        a.extend(["--concurrency".into(), c.to_string()]);
    }
    a
}

/// Starts Envoy. As root, Envoy runs as `cfg.envoy_uid` (gid the same, supplementary groups
/// cleared), as in Kubernetes where the proxy container runs as 1337. Envoy is killed if the
/// agent dies, so it is never left orphaned.
pub fn spawn(cfg: &Config, bootstrap: &Path, module_dir: &Path) -> Result<Child, EnvoyError> {
    let mut cmd = Command::new(&cfg.binary_path);
    cmd.args(args(cfg, bootstrap))
        .stdin(Stdio::null())
        .kill_on_drop(true);
    if nix::unistd::geteuid().is_root() {
        cmd.uid(cfg.envoy_uid).gid(cfg.envoy_uid);
    }
    // Istio's span tags read these (istiod-core writes them as environment tags, so one
    // connection manager serves every proxy; istiod writes them as literals).
    let own = crate::workload::Workload::own(cfg);
    cmd.env(
        mesh_common::names::ENV_CANONICAL_SERVICE,
        &own.canonical_service,
    )
    .env(
        mesh_common::names::ENV_CANONICAL_REVISION,
        &own.canonical_revision,
    )
    // The OpenTelemetry tracer's service name: the node's service cluster (`app.namespace`), as
    // istiod writes it; the pod's own resource attributes, when it has some, come first.
    .env(
        mesh_common::names::ENV_OTEL_RESOURCE,
        otel_resource(
            cfg.otel_resource_attributes.as_deref(),
            &cfg.service_cluster,
        ),
    )
    // The proxy module: where Envoy finds it, and who this proxy is (a module cannot read
    // Envoy's node).
    .env(mesh_common::module::SEARCH_PATH_ENV, module_dir)
    .env(
        mesh_common::module::NODE_ENV,
        serde_json::to_string(&crate::bootstrap::module_node(cfg)).unwrap_or_default(),
    );
    // Under a FIPS policy Envoy's gRPC clients offer only FIPS's TLS 1.2 suites (as Istio).
    if let Some(suites) = cfg.features.compliance.and_then(|p| p.grpc_cipher_suites()) {
        cmd.env("GRPC_SSL_CIPHER_SUITES", suites);
    }
    // SAFETY: the closure runs in the forked child before exec and only calls prctl(2), which is
    // async-signal-safe; it allocates nothing and touches no lock. It runs after the uid change,
    // which would otherwise clear the parent-death signal.
    #[allow(unsafe_code)]
    unsafe {
        cmd.pre_exec(|| {
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                .map_err(std::io::Error::from)
        });
    }
    tracing::info!(binary = %cfg.binary_path.display(), args = ?args(cfg, bootstrap), "starting Envoy");
    cmd.spawn().map_err(|source| EnvoyError::Spawn {
        binary: cfg.binary_path.display().to_string(),
        source,
    })
}

/// `OTEL_RESOURCE_ATTRIBUTES` for Envoy: the pod's, with `service.name=service_cluster` added
/// unless it names a service already.
fn otel_resource(pod: Option<&str>, service_cluster: &str) -> String {
    let inherited = pod.unwrap_or_default().to_string();
    if inherited
        .split(',')
        .any(|kv| kv.trim_start().starts_with("service.name="))
    {
        return inherited;
    }
    let own = format!("service.name={service_cluster}");
    if inherited.trim().is_empty() {
        own
    } else {
        format!("{inherited},{own}")
    }
}

/// How the agent waits for connections to drain on a graceful stop.
#[derive(Debug, Clone, Copy)]
pub struct DrainPolicy {
    /// terminationDrainDuration (5s).
    pub termination: Duration,
    /// EXIT_ON_ZERO_ACTIVE_CONNECTIONS: wait for active connections to reach 0 instead.
    pub exit_on_zero_active: bool,
    /// MINIMUM_DRAIN_DURATION (5s): the wait before counting connections.
    pub minimum: Duration,
    /// Upper bound of the wait for zero connections (drainDuration, 45s).
    pub maximum: Duration,
}

/// Active downstream connections on Envoy's traffic listeners (not admin, stats or readiness).
pub async fn active_connections(admin_port: u16) -> Result<u64, crate::admin::AdminError> {
    let stats =
        crate::admin::get(admin_port, "/stats?usedonly&filter=downstream_cx_active%24").await?;
    Ok(crate::admin::parse_stats(&stats)
        .into_iter()
        .filter(|(name, _)| {
            name.starts_with("listener.")
                && !name.contains("worker_")
                && !name.starts_with("listener.envoy_internal_")
                && !name.starts_with("listener.0.0.0.0_15021")
                && !name.starts_with("listener.0.0.0.0_15090")
                && !name.starts_with("listener.admin")
        })
        .map(|(_, v)| v)
        .sum())
}

async fn wait_for_zero_connections(admin_port: u16, policy: DrainPolicy) {
    tokio::time::sleep(policy.minimum).await;
    let deadline = tokio::time::Instant::now() + policy.maximum;
    let mut errors = 0;
    while tokio::time::Instant::now() < deadline {
        match active_connections(admin_port).await {
            Ok(0) => return,
            Ok(n) => {
                errors = 0;
                tracing::info!(active = n, "waiting for connections to drain");
            }
            Err(e) => {
                errors += 1;
                if errors >= 5 {
                    tracing::warn!(error = %e, "cannot read Envoy's connection count; stopping");
                    return;
                }
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Stops Envoy. Graceful (Istio's sidecar shutdown): drain inbound listeners, then wait the
/// termination drain duration (or for zero active connections), then stop. An immediate request
/// arriving meanwhile cuts the wait short.
pub async fn stop(
    child: &mut Child,
    admin_port: u16,
    how: crate::drain::Shutdown,
    policy: DrainPolicy,
    drain: &crate::drain::Drain,
) {
    if how == crate::drain::Shutdown::Graceful {
        if let Err(e) =
            crate::admin::post(admin_port, "/drain_listeners?inboundonly&graceful").await
        {
            tracing::warn!(error = %e, "could not ask Envoy to drain");
        }
        let wait = async {
            if policy.exit_on_zero_active {
                wait_for_zero_connections(admin_port, policy).await;
            } else {
                tokio::time::sleep(policy.termination).await;
            }
        };
        tokio::select! {
            _ = wait => {}
            _ = drain.immediate() => {}
            _ = child.wait() => return,
        }
    }
    if let Err(e) = child.kill().await {
        tracing::warn!(error = %e, "could not stop Envoy");
    }
}
