//! `istiod-core serve` as a library: from a `ServeConfig`, the mesh config, the CA and its JWT
//! check, the control plane and its config watch, the debug port and the gRPC server (ADS, the
//! CA; TLS and the bearer token when asked), serving until `shutdown` resolves. Returns the
//! addresses it bound (`Bound`), so tests serve on port 0 in process.

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use mesh_common::tasks::{Ended, Supervisor};

use crate::ca::{Ca, CaError};
use crate::ca_server::{Authenticator, CaService, JwtAuthenticator, KeyError};
use crate::config::{PilotEnv, ServeArgs, ServeConfig};
use crate::config_store::ConfigError;
use crate::kube::identity::{TokenReviewAuthenticator, ca_from_cluster, publish_root};
use crate::{ControlPlane, Settings, ads_http, debug, push_context, xds_server};

/// Why `serve` could not start, or stopped before it was asked to.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("--mesh-config: {0}")]
    MeshConfig(ConfigError),
    #[error("cannot read {flag} {}: {source}", path.display())]
    Read {
        flag: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Ca(#[from] CaError),
    #[error(transparent)]
    JwtKey(#[from] KeyError),
    #[error("--ca-dir needs --jwt-public-key or --jwt-jwks to verify callers' tokens")]
    NoJwtKey,
    #[error("cannot connect to the Kubernetes API server: {0}")]
    Kube(#[from] crate::kube::ConnectError),
    #[error(
        "the CA's root from the cluster: {0} (check istiod-core's RBAC to get and create Secrets in its POD_NAMESPACE)"
    )]
    ClusterCa(#[from] crate::kube::identity::ClusterCaError),
    #[error(transparent)]
    ControlPlane(#[from] crate::Error),
    #[error("{server}: {reason}")]
    KubeSync { server: String, reason: String },
    #[error("cannot listen on {flag} {addr}: {source}")]
    Listen {
        flag: &'static str,
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error(transparent)]
    Grpc(#[from] tonic::transport::Error),
    #[error("{0}; exiting so the process is restarted")]
    TaskEnded(Ended),
}

/// How long the first list of every watched Kubernetes kind may take before `serve` gives up.
const KUBE_SYNC_LIMIT: Duration = Duration::from_secs(60);

/// A started server: the addresses it listens on, and the serving itself.
pub struct Bound {
    /// The gRPC address (ADS, and the CA when it is served).
    pub grpc: SocketAddr,
    /// The debug port, when `--debug-addr` was given.
    pub debug: Option<SocketAddr>,
    serving: Pin<Box<dyn Future<Output = Result<(), ServeError>> + Send>>,
}

impl Bound {
    /// Serves until the shutdown given to `serve` resolves (`Ok`), the gRPC server fails, or a
    /// background task ends (the config watch above all: a server that answers but never sees
    /// another config change must not stay up).
    pub async fn wait(self) -> Result<(), ServeError> {
        self.serving.await
    }
}

fn read(flag: &'static str, path: &Path) -> Result<Vec<u8>, ServeError> {
    std::fs::read(path).map_err(|source| ServeError::Read {
        flag,
        path: path.to_path_buf(),
        source,
    })
}

async fn listen(
    flag: &'static str,
    addr: SocketAddr,
) -> Result<tokio::net::TcpListener, ServeError> {
    let listen = |source| ServeError::Listen { flag, addr, source };
    tokio::net::TcpListener::bind(addr).await.map_err(listen)
}

/// How callers are authenticated by their tokens: the JWT check `--jwt-public-key` or
/// `--jwt-jwks` configures; without them, in a cluster (`cluster`), the API server's TokenReview.
/// The CA and the xDS server (a stream without a client certificate, by its bearer token, as
/// istiod does) share it.
fn authenticator(
    args: &ServeArgs,
    trust_domain: &str,
    cluster: Option<&kube::Client>,
) -> Result<Arc<dyn Authenticator>, ServeError> {
    let issuer = &args.jwt_issuer;
    Ok(match (&args.jwt_public_key, &args.jwt_jwks, cluster) {
        (Some(path), _, _) => Arc::new(JwtAuthenticator::from_pem(
            &read("--jwt-public-key", path)?,
            &path.display().to_string(),
            issuer,
            trust_domain,
        )?),
        (None, Some(path), _) => Arc::new(JwtAuthenticator::from_jwks(
            &read("--jwt-jwks", path)?,
            &path.display().to_string(),
            issuer,
            trust_domain,
        )?),
        (None, None, Some(client)) => {
            tracing::info!("the CA and xDS authenticate callers by TokenReview");
            Arc::new(TokenReviewAuthenticator::new(client.clone(), trust_domain))
        }
        (None, None, None) => return Err(ServeError::NoJwtKey),
    })
}

type CaServer =
    istio_proto::ca::istio_certificate_service_server::IstioCertificateServiceServer<CaService>;

/// The CA service, its callers authenticated by `auth`.
fn ca_service(ca: &Arc<Ca>, trust_domain: &str, auth: Arc<dyn Authenticator>) -> CaServer {
    tracing::info!(%trust_domain, "serving the CA");
    CaService::with_authenticator(ca.clone(), auth)
}

/// The CA in a cluster, as istiod serves it there.
struct ClusterIdentity {
    ca: Arc<Ca>,
    service: CaServer,
    /// Who callers are by their tokens (the CA's and the xDS streams').
    auth: Arc<dyn Authenticator>,
    /// Keeps `istio-ca-root-cert` in every namespace; runs for good ("root-cert-publisher").
    root_publisher: futures::future::BoxFuture<'static, ()>,
}

/// The CA from `--ca-dir`, else from the cluster's Secrets in POD_NAMESPACE
/// (`ca_from_cluster`); callers authenticated by the `--jwt-*` key, else by TokenReview; and the
/// publisher of its root to every namespace.
async fn cluster_identity(
    args: &ServeArgs,
    env: &PilotEnv,
    client: &kube::Client,
    trust_domain: &str,
) -> Result<ClusterIdentity, ServeError> {
    let max_ttl = Duration::from_secs(args.max_cert_ttl);
    let ca = Arc::new(match &args.ca_dir {
        Some(dir) => Ca::load_or_create(dir, trust_domain, max_ttl)?,
        None => ca_from_cluster(client, &env.pod_namespace, trust_domain, max_ttl).await?,
    });
    let auth = authenticator(args, trust_domain, Some(client))?;
    let service = ca_service(&ca, trust_domain, auth.clone());
    let root_publisher = Box::pin(publish_root(client.clone(), ca.root_pem().to_string()));
    Ok(ClusterIdentity {
        ca,
        service,
        auth,
        root_publisher,
    })
}

/// The serving certificate and key: `--tls-cert`/`--tls-key`, else one from the CA
/// unless on Istio's plaintext port 15010, else none (plaintext).
fn tls_identity(
    args: &ServeArgs,
    ca: Option<&Ca>,
) -> Result<Option<tonic::transport::Identity>, ServeError> {
    let pem = match (&args.tls_cert, &args.tls_key, ca) {
        (Some(cert), Some(key), _) => Some((read("--tls-cert", cert)?, read("--tls-key", key)?)),
        (_, _, Some(ca)) if args.grpc_addr.port() != 15010 => {
            let (chain, key) = ca.serving_cert(
                &[
                    "istiod.istio-system.svc",
                    "istiod.istio-system.svc.cluster.local",
                    "istiod",
                    "localhost",
                ],
                Duration::from_secs(365 * 24 * 3600),
            )?;
            Some((chain.into_bytes(), key.into_bytes()))
        }
        _ => None,
    };
    Ok(pem.map(|(cert, key)| tonic::transport::Identity::from_pem(cert, key)))
}

/// Starts serving `cfg` until `shutdown` resolves; returns once every port is bound.
pub async fn serve(
    cfg: ServeConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<Bound, ServeError> {
    let ServeConfig { args, env } = cfg;
    let grace = args.shutdown_duration;
    // The trust domain is fixed for the process: the CA issues in it and the generators
    // expect it; the flag wins over the mesh config, which wins over the default.
    let mesh = match &args.mesh_config {
        Some(path) => Some(
            crate::store::MeshConfigFile::new(path.clone())
                .read()
                .map_err(ServeError::MeshConfig)?,
        ),
        None => None,
    };
    let trust_domain = args
        .trust_domain
        .clone()
        .or_else(|| mesh.as_ref().and_then(|m| m.trust_domain.clone()))
        .unwrap_or_else(|| push_context::DEFAULT_TRUST_DOMAIN.to_string());
    let api_server =
        crate::kube::ApiServer::from_flags(args.kubeconfig.as_deref(), args.in_cluster);
    let client = match &api_server {
        Some(server) => Some(crate::kube::connect(server).await?),
        None => None,
    };
    let mut root_publisher = None;
    let (ca, ca_service, token_auth) = match &client {
        Some(client) => {
            let id = cluster_identity(&args, &env, client, &trust_domain).await?;
            root_publisher = Some(id.root_publisher);
            (Some(id.ca), Some(id.service), Some(id.auth))
        }
        None => {
            let ca = match &args.ca_dir {
                Some(dir) => Some(Arc::new(Ca::load_or_create(
                    dir,
                    &trust_domain,
                    Duration::from_secs(args.max_cert_ttl),
                )?)),
                None => None,
            };
            let (service, auth) = match &ca {
                Some(ca) => {
                    let auth = authenticator(&args, &trust_domain, None)?;
                    (
                        Some(ca_service(ca, &trust_domain, auth.clone())),
                        Some(auth),
                    )
                }
                None => (None, None),
            };
            (ca, service, auth)
        }
    };
    let mut tasks = Supervisor::new();
    // The Kubernetes API server's config, listed in full before anything is served.
    let mut sources: Vec<Arc<dyn crate::store::ConfigStore>> = Vec::new();
    // Where allocated addresses are recorded, once the control plane exists.
    let mut address_record = None;
    if let (Some(server), Some(client)) = (&api_server, &client) {
        let source = crate::kube::source::KubeSource::new(crate::kube::source::kinds(
            &env.pod_namespace,
            &env.mesh_config_map,
        ));
        tasks.spawn_forever("kubernetes-watch", source.clone().run(client.clone()));
        let started = std::time::Instant::now();
        source
            .wait_synced(KUBE_SYNC_LIMIT)
            .await
            .map_err(|reason| ServeError::KubeSync {
                server: server.to_string(),
                reason,
            })?;
        tracing::info!(%server, took = ?started.elapsed(), "Kubernetes config listed; watching");
        let identity = instance_name(&env);
        // The Gateway API's status is always written, as istiod's gateway controller does.
        tasks.spawn_forever(
            "gateway-api-status",
            crate::kube::gateway_status::run(
                client.clone(),
                source.clone(),
                env.pod_namespace.clone(),
                identity.clone(),
                args.domain_suffix.clone(),
            ),
        );
        if env.auto_allocate {
            address_record = Some((client.clone(), source.clone(), identity.clone()));
        }
        if env.enable_status {
            tasks.spawn_forever(
                "config-status",
                crate::kube::status::run(
                    client.clone(),
                    source.clone(),
                    env.pod_namespace.clone(),
                    identity,
                ),
            );
        }
        if env.gateway_deployment {
            tasks.spawn_forever(
                "gateway-deployment",
                crate::kube::gateway_deploy::run(
                    client.clone(),
                    source.clone(),
                    crate::kube::gateway_deploy::Settings {
                        istio_namespace: env.pod_namespace.clone(),
                        injector_config_map: env.injector_config_map.clone(),
                        fallback_image: env.proxy_image.clone(),
                        trust_domain: trust_domain.clone(),
                        domain_suffix: args.domain_suffix.clone(),
                    },
                ),
            );
        }
        sources.push(source);
    }
    let cp = ControlPlane::open_with(
        Settings {
            config_dir: args.config_dir.clone(),
            mesh_file: args.mesh_config.clone(),
            domain_suffix: args.domain_suffix.clone(),
            trust_domain: trust_domain.clone(),
            scope_gateway_to_namespace: env.scope_gateway_to_namespace,
            cache_check: env.cache_check,
            cluster_id: env.cluster_id.clone(),
            auto_allocate: env.auto_allocate,
        },
        sources,
    )?;
    tasks.spawn_forever("config-watch", cp.clone().watch(env.debounce));
    if let Some((client, source, identity)) = address_record {
        tasks.spawn_forever(
            "ip-autoallocate",
            crate::kube::ip_allocate::run(
                client,
                source,
                env.pod_namespace.clone(),
                identity,
                cp.snapshots(),
            ),
        );
    }
    if let Some(publisher) = root_publisher {
        tasks.spawn_forever("root-cert-publisher", publisher);
    }
    cp.auto_registration().set_grace(env.workload_entry_grace);
    let transport = crate::transport::within_fds(
        crate::transport::TransportLimits {
            slots: mesh_common::conn_slots::SlotLimits {
                total: args.max_connections,
                per_peer: args.max_connections_per_peer,
                loopback: 1024,
            },
            handshake_timeout: args.handshake_timeout,
        },
        crate::transport::fds_for_connections(),
    );
    let connections = mesh_common::conn_slots::Slots::new("xDS port", transport.slots);
    let xds = cp
        .xds_with_limits(args.max_streams, env.push_throttle)
        .with_send_timeout(args.send_timeout, Some(connections.clone()))
        .with_identifier(&instance_name(&env));
    let stop = shutdown.boxed().shared();
    let debug = match args.debug_addr {
        Some(addr) => {
            let listener = listen("--debug-addr", addr).await?;
            let bound = local_addr("--debug-addr", addr, &listener)?;
            tracing::info!(addr = %bound, "serving /debug");
            tasks.spawn_forever(
                "debug",
                debug::serve(listener, cp.clone(), xds.clone(), stop.clone()),
            );
            Some(bound)
        }
        None => None,
    };
    let listener = listen("--grpc-addr", args.grpc_addr).await?;
    let grpc = local_addr("--grpc-addr", args.grpc_addr, &listener)?;
    let mut server = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(args.keepalive_interval))
        .http2_keepalive_timeout(Some(args.keepalive_timeout));
    let tls = tls_identity(&args, ca.as_deref())?;
    let serving_tls = tls.is_some();
    if let Some(identity) = tls {
        let mut config = tonic::transport::ServerTlsConfig::new().identity(identity);
        if let Some(ca) = &ca {
            config = config
                .client_ca_root(tonic::transport::Certificate::from_pem(ca.root_pem()))
                .client_auth_optional(true);
        }
        server = server.tls_config(config)?;
    }
    let token = match &args.token_file {
        Some(path) => Some(
            std::fs::read_to_string(path)
                .map_err(|source| ServeError::Read {
                    flag: "--token-file",
                    path: path.clone(),
                    source,
                })?
                .trim()
                .to_string(),
        ),
        None => None,
    };
    if !serving_tls && token.is_none() {
        warn_unauthenticated(grpc);
    }
    tracing::info!(addr = %grpc, tls = serving_tls, token = token.is_some(), "serving xDS");
    let serving = server
        .layer(crate::transport::MarkBusy(connections.clone()))
        .add_optional_service(ca_service)
        .add_service(tonic::service::interceptor::InterceptedService::new(
            ads_http::AdsHttp {
                server: xds,
                token_auth,
            },
            xds_server::bearer_check(token),
        ))
        .serve_with_incoming_shutdown(
            crate::transport::incoming(listener, connections, transport.handshake_timeout),
            stop.clone(),
        );
    Ok(Bound {
        grpc,
        debug,
        serving: Box::pin(until_stopped(serving, tasks, stop, grace)),
    })
}

/// Plaintext without a bearer token authenticates nobody: whoever reaches the port gets any
/// proxy's config by naming it in a node id (every namespace's services, and a router's
/// Secrets are only withheld because no caller is verified). Said at start, where an operator
/// looks, not buried in the info line.
/// This instance's name: POD_NAME, else the host name and process id.
fn instance_name(env: &PilotEnv) -> String {
    env.pod_name.clone().unwrap_or_else(|| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_else(|_| "istiod-core".into());
        format!("{host}-{}", std::process::id())
    })
}

fn warn_unauthenticated(grpc: SocketAddr) {
    tracing::warn!(
        addr = %grpc,
        "UNAUTHENTICATED xDS: serving plaintext gRPC without --token-file, so any client that \
         can reach {grpc} gets the mesh's config for any node id it names. Give --token-file (and \
         the agents the same token), or TLS (--ca-dir on a port other than 15010, or \
         --tls-cert/--tls-key), or keep the address on loopback"
    );
}

fn local_addr(
    flag: &'static str,
    addr: SocketAddr,
    listener: &tokio::net::TcpListener,
) -> Result<SocketAddr, ServeError> {
    listener
        .local_addr()
        .map_err(|source| ServeError::Listen { flag, addr, source })
}

/// Runs the gRPC server until `stop`; a background task ending before that is an error. After
/// `stop` the servers wind down (the debug port's task ends then, as it should): new
/// connections are refused and the open ones get `grace` (`--shutdown-duration`) to end, then
/// are closed. Proxies hold their ADS streams open for good: without the bound a graceful
/// shutdown would never end and SIGTERM would wait for the SIGKILL.
async fn until_stopped(
    serving: impl Future<Output = Result<(), tonic::transport::Error>>,
    mut tasks: Supervisor,
    stop: impl Future<Output = ()>,
    grace: std::time::Duration,
) -> Result<(), ServeError> {
    tokio::pin!(serving);
    tokio::select! {
        biased;
        () = stop => {}
        served = &mut serving => return Ok(served?),
        ended = tasks.ended() => return Err(ServeError::TaskEnded(ended)),
    }
    match tokio::time::timeout(grace, &mut serving).await {
        Ok(served) => Ok(served?),
        Err(_) => {
            tracing::info!(
                ?grace,
                "streams still open after the shutdown grace; closing them"
            );
            Ok(())
        }
    }
}
