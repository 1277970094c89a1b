//! pilot-agent: runs beside Envoy. Writes the bootstrap, starts and supervises Envoy, proxies its
//! xDS to the control plane (istiod-core in process by default), and serves readiness on :15020.
//! Mirrors Istio's `pilot/cmd/pilot-agent` and `pkg/istio-agent`.

pub mod admin;
pub mod app_uid;
pub mod bootstrap;
pub mod cli;
pub mod compress;
pub mod config;
pub mod dns;
pub mod drain;
pub mod embedded;
pub mod envoy;
pub mod grpc_client;
pub mod health;
pub mod http_client;
pub mod identity;
pub mod metrics;
pub mod probes;
pub mod proxy_module;
pub mod sds;
pub mod status;
pub mod uds;
pub mod workload;
pub mod xds_adapt;
pub mod xds_proxy;

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::Arc;

use config::{Config, ControlPlaneSource};
use drain::Drain;
use mesh_common::tasks::Supervisor;

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    Config(#[from] config::ConfigError),
    #[error("embedded control plane: {0}")]
    ControlPlane(#[from] embedded::EmbeddedError),
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
    #[error(transparent)]
    Module(#[from] proxy_module::ModuleError),
    #[error("workload identity: {0}")]
    Identity(String),
    #[error(transparent)]
    Sds(#[from] sds::SdsError),
    #[error("Envoy exited unexpectedly ({0}); the agent exits so the container restarts")]
    EnvoyExited(std::process::ExitStatus),
    #[error("{0}; the agent exits so the container restarts")]
    TaskEnded(mesh_common::tasks::Ended),
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

/// The upstream Envoy's xDS is proxied to: the embedded control plane, started here (with its
/// config watch), or a remote one.
fn start_control_plane(
    cfg: &Config,
    tasks: &mut Supervisor,
) -> Result<xds_proxy::Upstream, AgentError> {
    match &cfg.control_plane {
        ControlPlaneSource::Embedded {
            config_dir,
            mesh_file,
        } => Ok(xds_proxy::Upstream::Embedded(embedded::start(
            config_dir,
            mesh_file.as_ref(),
            &cfg.identity.identity.trust_domain,
            &cfg.embedded,
            tasks,
        )?)),
        ControlPlaneSource::Remote { address } => Ok(xds_proxy::Upstream::Remote {
            address: address.clone(),
            client: cfg.xds_client.clone().ok_or_else(|| config::ConfigError {
                input: "discoveryAddress".into(),
                value: address.clone(),
                expected: "dial options for a remote control plane".into(),
            })?,
        }),
    }
}

/// Creates the directory of Envoy's bootstrap and xDS socket. Envoy runs as another uid (when
/// the agent is root) and must reach what is inside. A pod's emptyDir is used as it is when
/// Envoy can enter it.
fn prepare_config_dir(cfg: &Config) -> Result<(), AgentError> {
    let dir_fail = |source| AgentError::Write {
        path: cfg.config_path.clone(),
        source,
    };
    std::fs::create_dir_all(&cfg.config_path).map_err(dir_fail)?;
    if let Some(mode) = uds::set_dir_mode(&cfg.config_path, 0o755).map_err(dir_fail)? {
        let envoy_enters =
            mode & 0o005 == 0o005 || cfg.envoy_uid == nix::unistd::geteuid().as_raw();
        if !envoy_enters {
            return Err(dir_fail(std::io::Error::other(format!(
                "owned by another uid, mode {mode:o}: Envoy (uid {}) cannot enter it",
                cfg.envoy_uid
            ))));
        }
    }
    Ok(())
}

/// Starts keeping the workload certificate fresh, from the configured source, and its expiry
/// gauge. Returns the certificate's watch.
fn start_identity(
    cfg: &Config,
    tasks: &mut Supervisor,
    metrics: &Arc<metrics::Metrics>,
) -> Result<identity::CertWatch, AgentError> {
    use config::CertSource;
    use embedded::EmbeddedSigner;
    use identity::RemoteSigner;
    let (tx, rx) = tokio::sync::watch::channel(None);
    let id = Arc::new(cfg.identity.clone());
    match &cfg.identity.source {
        CertSource::Embedded { ca_dir } => {
            let signer =
                EmbeddedSigner::open(ca_dir, &id.identity, id.ttl).map_err(AgentError::Identity)?;
            tasks.spawn_forever(
                "identity",
                identity::run_rotation(id, signer, tx, metrics.clone()),
            );
        }
        CertSource::Remote { address, client } => {
            let signer = RemoteSigner {
                address: address.clone(),
                client: client.clone(),
            };
            tasks.spawn_forever(
                "identity",
                identity::run_rotation(id, signer, tx, metrics.clone()),
            );
        }
        CertSource::Files(files) => {
            tasks.spawn_forever(
                "identity",
                identity::run_mounted(id, files.clone(), tx, metrics.clone()),
            );
        }
    }
    tasks.spawn_forever(
        "cert-metrics",
        identity::export_expiry(rx.clone(), metrics.clone()),
    );
    Ok(rx)
}

/// Who may connect to the SDS and xDS sockets (root, Envoy's uid, the agent's), and the owner
/// the sockets are given (Envoy's uid, when the agent is root).
struct SocketAccess {
    peers: Vec<u32>,
    owner: Option<u32>,
}

impl SocketAccess {
    fn for_envoy(cfg: &Config) -> SocketAccess {
        SocketAccess {
            peers: uds::allowed_uids(cfg.envoy_uid),
            owner: nix::unistd::geteuid().is_root().then_some(cfg.envoy_uid),
        }
    }
}

/// Serves the workload certificate to Envoy over SDS. Returns the socket's path.
fn start_sds(
    cfg: &Config,
    tasks: &mut Supervisor,
    drain: &Drain,
    certs: &identity::CertWatch,
    access: &SocketAccess,
) -> Result<PathBuf, AgentError> {
    let path = PathBuf::from(sds::SOCKET_PATH);
    let listener = sds::bind(&path, access.owner)?;
    let drain = drain.clone();
    tasks.spawn(
        "sds",
        sds::serve(
            listener,
            access.peers.clone(),
            certs.clone(),
            cfg.identity.file_allow_dirs.clone(),
            async move { drain.finished().await },
        ),
    );
    Ok(path)
}

/// Serves the status port (15020). Returns where readiness learns of the DNS proxy's table.
async fn start_status(
    cfg: &Config,
    tasks: &mut Supervisor,
    drain: &Drain,
    metrics: &Arc<metrics::Metrics>,
    certs: &identity::CertWatch,
    adapt: Option<Arc<xds_adapt::Adapter>>,
) -> Result<tokio::sync::watch::Sender<Option<dns::TableWatch>>, AgentError> {
    // Readiness also waits for the DNS table when the DNS proxy is on.
    let (dns_tx, dns_rx) = tokio::sync::watch::channel(None);
    let listener =
        status::bind(cfg.status_port)
            .await
            .map_err(|source| AgentError::StatusPort {
                port: cfg.status_port,
                source,
            })?;
    let state = status::State::new(cfg, drain.clone(), metrics.clone(), dns_rx, certs.clone())
        .with_xds_adapt(adapt);
    tasks.spawn_forever("status", status::serve(listener, state));
    Ok(dns_tx)
}

/// Starts the DNS proxy when it is on, and tells readiness of its table. Returns what the xDS
/// proxy needs to fill the table from NDS.
fn start_dns(
    cfg: &Config,
    tasks: &mut Supervisor,
    metrics: &Arc<metrics::Metrics>,
    status_dns: &tokio::sync::watch::Sender<Option<dns::TableWatch>>,
) -> Option<xds_proxy::DnsState> {
    let dns_cfg = cfg.dns.as_ref()?;
    let (table, readiness) = dns::start(dns_cfg, metrics.clone(), tasks);
    status_dns.send_replace(Some(readiness));
    Some(xds_proxy::DnsState {
        table,
        pod_namespace: cfg.pod_namespace.clone(),
        search: dns_cfg.search.clone(),
    })
}

/// Starts the VM health checker when ProxyConfig has a `readinessProbe`: its verdicts, which
/// the xDS proxy reports to the control plane, take Envoy's readiness (as 15021's) with the
/// probe.
fn start_health(
    cfg: &Config,
    tasks: &mut Supervisor,
    drain: &Drain,
    certs: &identity::CertWatch,
    status_dns: &tokio::sync::watch::Sender<Option<dns::TableWatch>>,
) -> Option<health::HealthWatch> {
    let probe = cfg.health_probe.clone()?;
    let (tx, rx) = tokio::sync::watch::channel(None);
    let (admin_port, drain, certs, dns) = (
        cfg.admin_port,
        drain.clone(),
        certs.clone(),
        status_dns.subscribe(),
    );
    let envoy_ready = move || {
        let (drain, certs, dns) = (drain.clone(), certs.clone(), dns.clone());
        async move { status::readiness(admin_port, &drain, &dns, &certs).await }
    };
    tasks.spawn_forever(
        "health",
        health::run(probe, cfg.probe_target, envoy_ready, tx),
    );
    Some(rx)
}

/// Serves Envoy's xDS on the socket in the config directory, proxied to `upstream`. Returns the
/// socket's path.
#[allow(clippy::too_many_arguments)]
fn start_xds(
    cfg: &Config,
    tasks: &mut Supervisor,
    upstream: xds_proxy::Upstream,
    drain: &Drain,
    metrics: &Arc<metrics::Metrics>,
    (dns, health): (Option<xds_proxy::DnsState>, Option<health::HealthWatch>),
    adapt: Option<Arc<xds_adapt::Adapter>>,
    access: &SocketAccess,
) -> Result<PathBuf, AgentError> {
    let path = cfg.xds_socket_path();
    let listener = xds_proxy::bind(&path, access.owner)?;
    let drain = drain.clone();
    tasks.spawn(
        XDS_TASK,
        xds_proxy::serve(
            listener,
            access.peers.clone(),
            upstream,
            metrics.clone(),
            dns,
            health,
            adapt,
            async move { drain.finished().await },
        ),
    );
    Ok(path)
}

const XDS_TASK: &str = "xds-proxy";

/// Runs the sidecar agent until shutdown. Envoy exiting, or any background task ending, ends
/// it with an error (the container restarts), never a process left running without them.
pub async fn run(cfg: Config) -> Result<(), AgentError> {
    tracing::info!(config = ?cfg, "starting pilot-agent");
    let mut tasks = Supervisor::new();
    let upstream = start_control_plane(&cfg, &mut tasks)?;
    let drain = Drain::default();
    tasks.spawn("signals", listen_for_signals(drain.clone()));
    let metrics = Arc::new(metrics::Metrics::new());
    prepare_config_dir(&cfg)?;
    let access = SocketAccess::for_envoy(&cfg);
    let certs = start_identity(&cfg, &mut tasks, &metrics)?;
    let sds_socket = start_sds(&cfg, &mut tasks, &drain, &certs, &access)?;
    let adapt = cfg
        .xds_adapt
        .then(|| Arc::new(xds_adapt::Adapter::new(metrics.clone())));
    let status_dns =
        start_status(&cfg, &mut tasks, &drain, &metrics, &certs, adapt.clone()).await?;
    let dns = start_dns(&cfg, &mut tasks, &metrics, &status_dns);
    let health = start_health(&cfg, &mut tasks, &drain, &certs, &status_dns);
    let xds_socket = start_xds(
        &cfg,
        &mut tasks,
        upstream,
        &drain,
        &metrics,
        (dns, health),
        adapt,
        &access,
    )?;

    let module_dir = proxy_module::prepare(&cfg.binary_path).await?;
    let bootstrap_path = cfg.bootstrap_path();
    let bootstrap = serde_json::to_vec_pretty(&bootstrap::render(&cfg)).unwrap_or_default();
    write_file(&bootstrap_path, &bootstrap, 0o644)?;
    let mut child = envoy::spawn(&cfg, &bootstrap_path, &module_dir)?;
    // Envoy runs as the configured proxy uid when the agent is root, else as the agent's own.
    let proxy_uid = if nix::unistd::geteuid().is_root() {
        cfg.envoy_uid
    } else {
        nix::unistd::geteuid().as_raw()
    };
    let pod_ports = cfg
        .metadata
        .iter()
        .find(|(k, _)| k == app_uid::POD_PORTS)
        .map(|(_, v)| v.clone());
    tokio::spawn(app_uid::watch(pod_ports, proxy_uid));
    let result = supervise(&cfg, &mut child, &drain, &mut tasks).await;
    drain.trigger(drain::Shutdown::Immediate);
    drain.finish();
    tasks.wait_for(XDS_TASK).await;
    for path in [&bootstrap_path, &xds_socket, &sds_socket] {
        let _ = std::fs::remove_file(path);
    }
    tracing::info!("pilot-agent stopped");
    result
}

/// Waits for a drain (then stops Envoy gracefully), Envoy's exit or a task's end, whichever
/// comes first.
async fn supervise(
    cfg: &Config,
    child: &mut tokio::process::Child,
    drain: &Drain,
    tasks: &mut Supervisor,
) -> Result<(), AgentError> {
    tokio::select! {
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
            envoy::stop(child, cfg.admin_port, how, policy, drain).await;
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
    }
}
