use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};

/// mimalloc rather than the system allocator: a push to many proxies allocates and frees large
/// buffers in bursts, and glibc keeps the high-water mark resident; mimalloc returns freed
/// memory to the system.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "istiod-core",
    about = "A small istiod: config directory in, xDS over gRPC out"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Check a config directory: every file parses and validates, and the services build.
    /// Prints each error (file, document, field) and exits 1 if there is any.
    Validate {
        /// The directory `serve --config-dir` would read.
        dir: PathBuf,
        /// DNS suffix of Kubernetes services.
        #[arg(long = "domain-suffix", default_value = istiod_core::DEFAULT_DOMAIN_SUFFIX)]
        domain_suffix: String,
    },
    /// Serve ADS for the mesh described in a config directory.
    Serve(Box<ServeArgs>),
}

#[derive(clap::Args)]
struct ServeArgs {
    /// Directory of Kubernetes-style YAML/JSON (ServiceEntry, WorkloadEntry, Service, Endpoints, ...).
    #[arg(long = "config-dir")]
    config_dir: PathBuf,
    /// Address for the gRPC xDS server.
    #[arg(long = "grpc-addr", default_value = "127.0.0.1:15010")]
    grpc_addr: SocketAddr,
    /// DNS suffix of Kubernetes services.
    #[arg(long = "domain-suffix", default_value = istiod_core::DEFAULT_DOMAIN_SUFFIX)]
    domain_suffix: String,
    /// Serve TLS with this certificate chain (PEM); requires --tls-key.
    #[arg(long = "tls-cert", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// Private key (PEM) of --tls-cert.
    #[arg(long = "tls-key", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Require `authorization: Bearer <contents of this file>` on every xDS stream.
    #[arg(long = "token-file")]
    token_file: Option<PathBuf>,
    /// Serve the CA (istio.v1.auth.IstioCertificateService) with the root kept in this
    /// directory (or Istio's cacerts files found there). Requires --jwt-public-key or
    /// --jwt-jwks. Unless --grpc-addr is on 15010 (Istio's plaintext port) or --tls-cert is
    /// given, gRPC is served over TLS with a certificate for istiod.istio-system.svc from
    /// this CA, and mesh client certificates also authenticate CA calls.
    #[arg(long = "ca-dir")]
    ca_dir: Option<PathBuf>,
    /// PEM public key (EC P-256 or RSA) that signs the service-account tokens the CA accepts.
    #[arg(
        long = "jwt-public-key",
        requires = "ca_dir",
        conflicts_with = "jwt_jwks"
    )]
    jwt_public_key: Option<PathBuf>,
    /// A JWKS file (EC P-256 / RSA keys) instead of --jwt-public-key.
    #[arg(long = "jwt-jwks", requires = "ca_dir")]
    jwt_jwks: Option<PathBuf>,
    /// Issuer the CA requires in those tokens.
    #[arg(
        long = "jwt-issuer",
        default_value = "https://kubernetes.default.svc.cluster.local"
    )]
    jwt_issuer: String,
    /// The mesh trust domain of issued identities [default: the mesh config's trustDomain,
    /// else cluster.local].
    #[arg(long = "trust-domain")]
    trust_domain: Option<String>,
    /// Mesh config file (MeshConfig YAML, as istiod's --meshConfig): rootNamespace,
    /// enableAutoMtls, outboundTrafficPolicy and trustDomain are acted on. Watched.
    #[arg(long = "mesh-config", alias = "meshConfig")]
    mesh_config: Option<PathBuf>,
    /// Longest certificate lifetime the CA issues, in seconds.
    #[arg(long = "max-cert-ttl", default_value_t = 7 * 24 * 3600)]
    max_cert_ttl: u64,
    /// Serve /debug/syncz, /debug/configz and /debug/registryz (JSON) on this address
    /// (istiod uses 15014).
    #[arg(long = "debug-addr")]
    debug_addr: Option<SocketAddr>,
    /// Refuse ADS streams beyond this many at once (RESOURCE_EXHAUSTED).
    #[arg(long = "max-streams", default_value_t = istiod_core::xds_server::DEFAULT_MAX_STREAMS)]
    max_streams: usize,
}

/// `istiod-core validate DIR`: 0 when the directory is good, 1 otherwise.
fn validate(dir: &std::path::Path, domain_suffix: &str) -> i32 {
    let (set, mut errors) = istiod_core::config_store::validate_dir(dir);
    let set = std::sync::Arc::new(set);
    let mut messages: Vec<String> = errors.drain(..).map(|e| e.to_string()).collect();
    let services =
        match istiod_core::push_context::PushContext::build(set.clone(), domain_suffix, "0".into())
        {
            Ok(push) => {
                // Accepted but not acted on: said, not fatal.
                for w in &push.warnings {
                    eprintln!("warning: {w}");
                }
                push.services.len()
            }
            Err(e) => {
                messages.push(e.to_string());
                0
            }
        };
    if messages.is_empty() {
        println!(
            "{}: ok ({} resources, {services} services)",
            dir.display(),
            set.resources.len()
        );
        0
    } else {
        for m in &messages {
            eprintln!("error: {m}");
        }
        eprintln!("{}: {} error(s)", dir.display(), messages.len());
        1
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Validate { dir, domain_suffix } => {
            std::process::exit(validate(&dir, &domain_suffix))
        }
        Command::Serve(args) => serve(*args).await,
    }
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let ServeArgs {
        config_dir,
        grpc_addr,
        domain_suffix,
        tls_cert,
        tls_key,
        token_file,
        ca_dir,
        jwt_public_key,
        jwt_jwks,
        jwt_issuer,
        trust_domain,
        max_cert_ttl,
        debug_addr,
        max_streams,
        mesh_config,
    } = args;
    // The trust domain is fixed for the process: the CA issues in it and the generators
    // expect it; the flag wins over the mesh config, which wins over the default.
    let mesh = match &mesh_config {
        Some(path) => Some(
            istiod_core::store::MeshConfigFile { path: path.clone() }
                .read()
                .map_err(|e| anyhow::anyhow!("--mesh-config: {e}"))?,
        ),
        None => None,
    };
    let trust_domain = trust_domain
        .or_else(|| mesh.as_ref().and_then(|m| m.trust_domain.clone()))
        .unwrap_or_else(|| istiod_core::push_context::DEFAULT_TRUST_DOMAIN.to_string());
    let read = |flag: &str, p: &PathBuf| {
        std::fs::read(p).map_err(|e| anyhow::anyhow!("cannot read {flag} {}: {e}", p.display()))
    };
    let ca = match &ca_dir {
        Some(dir) => Some(std::sync::Arc::new(istiod_core::ca::Ca::load_or_create(
            dir,
            &trust_domain,
            Duration::from_secs(max_cert_ttl),
        )?)),
        None => None,
    };
    let ca_service = match &ca {
        Some(ca) => {
            let auth = match (&jwt_public_key, &jwt_jwks) {
                (Some(path), _) => istiod_core::ca_server::JwtAuthenticator::from_pem(
                    &read("--jwt-public-key", path)?,
                    &path.display().to_string(),
                    &jwt_issuer,
                    &trust_domain,
                )?,
                (None, Some(path)) => istiod_core::ca_server::JwtAuthenticator::from_jwks(
                    &read("--jwt-jwks", path)?,
                    &path.display().to_string(),
                    &jwt_issuer,
                    &trust_domain,
                )?,
                (None, None) => anyhow::bail!(
                    "--ca-dir needs --jwt-public-key or --jwt-jwks to verify callers' tokens"
                ),
            };
            tracing::info!(%trust_domain, "serving the CA");
            Some(istiod_core::ca_server::CaService::new(
                ca.clone(),
                std::sync::Arc::new(auth),
            ))
        }
        None => None,
    };
    let cp = istiod_core::ControlPlane::load_with_mesh_config(
        Some(&config_dir),
        mesh_config.as_deref(),
        &domain_suffix,
        &trust_domain,
    )?;
    let debounce = istiod_core::Debounce::from_env(&|k| std::env::var(k).ok())
        .map_err(|e| anyhow::anyhow!(e))?;
    let mut tasks = mesh_common::tasks::Supervisor::new();
    tasks.spawn_forever("config-watch", cp.clone().watch(debounce));
    if istiod_core::push_context::cache_check_from_env(&|k| std::env::var(k).ok()) {
        tracing::warn!("ISTIOD_CACHE_CHECK: every cached resource is generated again and compared");
    }
    cp.auto_registration().set_grace(
        istiod_core::autoregister::grace_from_env(&|k| std::env::var(k).ok())
            .map_err(|e| anyhow::anyhow!(e))?,
    );
    let throttle = std::env::var("PILOT_PUSH_THROTTLE")
        .ok()
        .map(|v| {
            v.trim()
                .parse::<usize>()
                .map_err(|_| anyhow::anyhow!("PILOT_PUSH_THROTTLE={v:?}: expected a whole number"))
        })
        .transpose()?
        .filter(|n| *n > 0)
        .unwrap_or_else(istiod_core::xds_server::default_push_throttle);
    let xds = cp.xds_with_limits(max_streams, throttle);
    if let Some(addr) = debug_addr {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| anyhow::anyhow!("cannot listen on --debug-addr {addr}: {e}"))?;
        tracing::info!(%addr, "serving /debug");
        tasks.spawn_forever(
            "debug",
            istiod_core::debug::serve(listener, cp.clone(), xds.clone()),
        );
    }
    let listener = tokio::net::TcpListener::bind(grpc_addr).await?;
    let mut server = tonic::transport::Server::builder();
    let tls = match (&tls_cert, &tls_key, &ca) {
        (Some(cert), Some(key), _) => Some((read("--tls-cert", cert)?, read("--tls-key", key)?)),
        (_, _, Some(ca)) if grpc_addr.port() != 15010 => {
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
    let serving_tls = tls.is_some();
    if let Some((cert, key)) = tls {
        let mut config = tonic::transport::ServerTlsConfig::new()
            .identity(tonic::transport::Identity::from_pem(cert, key));
        if let Some(ca) = &ca {
            config = config
                .client_ca_root(tonic::transport::Certificate::from_pem(ca.root_pem()))
                .client_auth_optional(true);
        }
        server = server.tls_config(config)?;
    }
    let token = match &token_file {
        Some(p) => Some(
            std::fs::read_to_string(p)
                .map_err(|e| anyhow::anyhow!("cannot read --token-file {}: {e}", p.display()))?
                .trim()
                .to_string(),
        ),
        None => None,
    };
    tracing::info!(
        addr = %listener.local_addr()?,
        tls = serving_tls,
        token = token.is_some(),
        "serving xDS"
    );
    let serving = server
        .add_optional_service(ca_service)
        .add_service(tonic::service::interceptor::InterceptedService::new(
            istiod_core::ads_http::AdsHttp {
                server: xds.clone(),
            },
            istiod_core::xds_server::bearer_check(token),
        ))
        .serve_with_incoming_shutdown(
            tokio_stream::wrappers::TcpListenerStream::new(listener),
            shutdown_signal(),
        );
    // A background task that ends (the config watch above all) must not leave a server that
    // answers but never sees another config change.
    tokio::select! {
        served = serving => served?,
        ended = tasks.ended() => anyhow::bail!("{ended}; exiting so the process is restarted"),
    }
    Ok(())
}

/// SIGTERM (how Kubernetes stops a pod) or SIGINT.
async fn shutdown_signal() {
    if let Err(e) = mesh_common::tasks::stop_signal().await {
        tracing::error!(error = %e, "cannot install the SIGTERM handler; SIGINT only");
        let _ = tokio::signal::ctrl_c().await;
    }
}
