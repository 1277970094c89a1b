//! pilot-agent: runs beside Envoy. Writes the bootstrap, starts and supervises Envoy, proxies its
//! xDS to the control plane (istiod-core in process by default), and serves readiness on :15020.
//! Mirrors Istio's `pilot/cmd/pilot-agent` and `pkg/istio-agent`.

pub mod admin;
pub mod bootstrap;
pub mod config;
pub mod dns;
pub mod drain;
pub mod envoy;
pub mod grpc_client;
pub mod identity;
pub mod metrics;
pub mod probes;
pub mod sds;
pub mod status;
pub mod uds;
pub mod xds_proxy;

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use config::{Config, ControlPlaneSource};
use drain::Drain;
use mesh_common::tasks::Supervisor;

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    Config(#[from] config::ConfigError),
    #[error("embedded control plane: {0}")]
    ControlPlane(#[from] istiod_core::Error),
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot serve the status port {port}: {source}")]
    StatusPort { port: u16, source: std::io::Error },
    #[error(transparent)]
    XdsProxy(#[from] xds_proxy::XdsProxyError),
    #[error(transparent)]
    Envoy(#[from] envoy::EnvoyError),
    #[error("workload identity: {0}")]
    Identity(String),
    #[error(transparent)]
    Sds(#[from] sds::SdsError),
    #[error("Envoy exited unexpectedly ({0}); the agent exits so the container restarts")]
    EnvoyExited(std::process::ExitStatus),
    #[error("{0}; the agent exits so the container restarts")]
    TaskEnded(mesh_common::tasks::Ended),
}

/// Sets `dir`'s permission bits to `mode`. A directory another uid owns cannot be chmod-ed (a
/// pod's emptyDir is root's, mode 0777, while the agent runs as 1337): it is left as it is, and
/// its mode is returned for the caller to judge; `None` when `mode` was set.
pub(crate) fn set_dir_mode(dir: &std::path::Path, mode: u32) -> std::io::Result<Option<u32>> {
    use std::os::unix::fs::MetadataExt;
    match std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode)) {
        Ok(()) => Ok(None),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            let meta = std::fs::metadata(dir)?;
            if meta.uid() == nix::unistd::geteuid().as_raw() {
                return Err(e);
            }
            Ok(Some(meta.mode() & 0o7777))
        }
        Err(e) => Err(e),
    }
}

fn write_file(path: &std::path::Path, contents: &[u8], mode: u32) -> Result<(), AgentError> {
    let fail = |source| AgentError::Write {
        path: path.to_path_buf(),
        source,
    };
    std::fs::write(path, contents).map_err(fail)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(fail)
}

/// Turns SIGTERM and SIGINT into a graceful drain.
async fn listen_for_signals(drain: Drain) -> std::io::Result<()> {
    mesh_common::tasks::stop_signal().await?;
    drain.trigger(drain::Shutdown::Graceful);
    Ok(())
}

/// Starts keeping the workload certificate fresh, from the configured source.
fn start_identity(cfg: &Config, tasks: &mut Supervisor) -> Result<identity::CertWatch, AgentError> {
    use config::CertSource;
    use identity::{EmbeddedSigner, RemoteSigner};
    let (tx, rx) = tokio::sync::watch::channel(None);
    let id = std::sync::Arc::new(cfg.identity.clone());
    match &cfg.identity.source {
        CertSource::Embedded { ca_dir } => {
            let ca = istiod_core::ca::Ca::load_or_create(
                ca_dir,
                &id.identity.trust_domain,
                id.ttl.max(istiod_core::ca::DEFAULT_TTL),
            )
            .map_err(|e| AgentError::Identity(e.to_string()))?;
            let signer = EmbeddedSigner {
                ca: std::sync::Arc::new(ca),
                identity: id.identity.clone(),
            };
            tasks.spawn_forever("identity", identity::run_rotation(id, signer, tx));
        }
        CertSource::Remote { address, client } => {
            let signer = RemoteSigner {
                address: address.clone(),
                client: client.clone(),
            };
            tasks.spawn_forever("identity", identity::run_rotation(id, signer, tx));
        }
        CertSource::Files(files) => {
            tasks.spawn_forever("identity", identity::run_mounted(id, files.clone(), tx));
        }
    }
    Ok(rx)
}

/// Runs the sidecar agent until shutdown. Envoy exiting, or any background task ending, ends
/// it with an error (the container restarts), never a process left running without them.
pub async fn run(cfg: Config) -> Result<(), AgentError> {
    tracing::info!(config = ?cfg, "starting pilot-agent");
    let mut tasks = Supervisor::new();
    let upstream = match &cfg.control_plane {
        ControlPlaneSource::Embedded {
            config_dir,
            mesh_file,
        } => {
            let cp = istiod_core::ControlPlane::load_with_mesh_config(
                Some(config_dir),
                mesh_file.as_deref(),
                istiod_core::DEFAULT_DOMAIN_SUFFIX,
                &cfg.identity.identity.trust_domain,
            )?;
            tasks.spawn_forever("config-watch", cp.clone().watch(cfg.debounce));
            if cfg.cache_check {
                istiod_core::push_context::set_cache_check(true);
            }
            xds_proxy::Upstream::Embedded(cp.xds())
        }
        ControlPlaneSource::Remote { address } => xds_proxy::Upstream::Remote {
            address: address.clone(),
            client: cfg.xds_client.clone().ok_or_else(|| config::ConfigError {
                input: "discoveryAddress".into(),
                value: address.clone(),
                expected: "dial options for a remote control plane".into(),
            })?,
        },
    };

    let drain = Drain::default();
    tasks.spawn("signals", listen_for_signals(drain.clone()));
    let metrics = std::sync::Arc::new(metrics::Metrics::new());
    // Readiness also waits for the DNS table when the DNS proxy is on.
    let (status_dns, status_dns_rx) = tokio::sync::watch::channel(None);

    let dir_fail = |source| AgentError::Write {
        path: cfg.config_path.clone(),
        source,
    };
    std::fs::create_dir_all(&cfg.config_path).map_err(dir_fail)?;
    // Envoy runs as another uid (when the agent is root) and must reach the socket and bootstrap
    // inside. A pod's emptyDir is used as it is when Envoy can enter it.
    if let Some(mode) = set_dir_mode(&cfg.config_path, 0o755).map_err(dir_fail)? {
        let envoy_enters =
            mode & 0o005 == 0o005 || cfg.envoy_uid == nix::unistd::geteuid().as_raw();
        if !envoy_enters {
            return Err(dir_fail(std::io::Error::other(format!(
                "owned by another uid, mode {mode:o}: Envoy (uid {}) cannot enter it",
                cfg.envoy_uid
            ))));
        }
    }

    let as_root = nix::unistd::geteuid().is_root();
    // Who may connect to the SDS and xDS sockets (root, Envoy's uid, the agent's).
    let socket_peers = uds::allowed_uids(cfg.envoy_uid);
    let certs = start_identity(&cfg, &mut tasks)?;
    let cert_metrics = metrics.clone();
    let mut cert_updates = certs.clone();
    cert_updates.mark_changed();
    tasks.spawn_forever("cert-metrics", async move {
        while cert_updates.changed().await.is_ok() {
            let expiry = cert_updates.borrow().as_ref().map(|c| {
                c.not_after
                    .duration_since(std::time::SystemTime::UNIX_EPOCH)
                    .map(|d| d.as_secs_f64())
                    .unwrap_or_default()
            });
            cert_metrics
                .cert_expiry_timestamp
                .set(expiry.unwrap_or_default());
        }
    });
    let sds_listener = sds::bind(
        std::path::Path::new(sds::SOCKET_PATH),
        as_root.then_some(cfg.envoy_uid),
    )?;
    let sds_drain = drain.clone();
    tasks.spawn(
        "sds",
        sds::serve(
            sds_listener,
            socket_peers.clone(),
            certs.clone(),
            cfg.identity.file_allow_dirs.clone(),
            async move { sds_drain.finished().await },
        ),
    );

    let status_listener =
        status::bind(cfg.status_port)
            .await
            .map_err(|source| AgentError::StatusPort {
                port: cfg.status_port,
                source,
            })?;
    tasks.spawn_forever(
        "status",
        status::serve(
            status_listener,
            status::State::new(
                &cfg,
                drain.clone(),
                metrics.clone(),
                status_dns_rx,
                certs.clone(),
            ),
        ),
    );

    let xds_listener = xds_proxy::bind(&cfg.xds_socket_path(), as_root.then_some(cfg.envoy_uid))?;
    let xds_drain = drain.clone();
    // The DNS proxy answers from the table the xDS proxy receives over NDS.
    let dns_state = match &cfg.dns {
        Some(dns_cfg) => {
            let (table_tx, table_rx) = tokio::sync::watch::channel(None);
            let upstreams = dns::Upstreams {
                servers: dns_cfg.upstreams.clone(),
                timeout: dns_cfg.forward_timeout,
                parallel: dns_cfg.forward_parallel,
            };
            let listen = dns_cfg.listen;
            let rx = table_rx.clone();
            let dns_metrics = metrics.clone();
            tasks.spawn("dns", dns::serve(listen, rx, upstreams, dns_metrics));
            status_dns.send_replace(Some(table_rx));
            Some(xds_proxy::DnsState {
                table: table_tx,
                pod_namespace: cfg.pod_namespace.clone(),
                search: dns_cfg.search.clone(),
            })
        }
        None => None,
    };
    tasks.spawn(
        "xds-proxy",
        xds_proxy::serve(
            xds_listener,
            socket_peers,
            upstream,
            metrics.clone(),
            dns_state,
            async move { xds_drain.finished().await },
        ),
    );

    let bootstrap_path = cfg.bootstrap_path();
    let bootstrap = serde_json::to_vec_pretty(&bootstrap::render(&cfg)).unwrap_or_default();
    write_file(&bootstrap_path, &bootstrap, 0o644)?;

    let mut child = envoy::spawn(&cfg, &bootstrap_path)?;
    let result = tokio::select! {
        // A drain first: the signal task ends once it has triggered one.
        biased;
        how = drain.triggered() => {
            tracing::info!(?how, wait = ?cfg.termination_drain_duration, "stopping Envoy");
            let policy = envoy::DrainPolicy {
                termination: cfg.termination_drain_duration,
                exit_on_zero_active: cfg.exit_on_zero_active_connections,
                minimum: cfg.minimum_drain_duration,
                maximum: cfg.drain_duration,
            };
            envoy::stop(&mut child, cfg.admin_port, how, policy, &drain).await;
            Ok(())
        }
        status = child.wait() => match status {
            Ok(s) => Err(AgentError::EnvoyExited(s)),
            Err(e) => Err(AgentError::Envoy(envoy::EnvoyError::Spawn {
                binary: cfg.binary_path.display().to_string(),
                source: e,
            })),
        },
        ended = tasks.ended() => {
            let _ = child.start_kill();
            let _ = child.wait().await;
            Err(AgentError::TaskEnded(ended))
        }
    };
    drain.trigger(drain::Shutdown::Immediate);
    drain.finish();
    tasks.wait_for("xds-proxy").await;
    let _ = std::fs::remove_file(&bootstrap_path);
    let _ = std::fs::remove_file(cfg.xds_socket_path());
    let _ = std::fs::remove_file(sds::SOCKET_PATH);
    tracing::info!("pilot-agent stopped");
    result
}
