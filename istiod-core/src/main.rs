use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};

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
    /// Serve ADS for the mesh described in a config directory.
    Serve {
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
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let Command::Serve {
        config_dir,
        grpc_addr,
        domain_suffix,
        tls_cert,
        tls_key,
        token_file,
    } = Cli::parse().command;
    let cp = istiod_core::ControlPlane::load(&config_dir, &domain_suffix)?;
    tokio::spawn(cp.clone().watch(Duration::from_secs(1)));
    let listener = tokio::net::TcpListener::bind(grpc_addr).await?;
    let mut server = tonic::transport::Server::builder();
    if let (Some(cert), Some(key)) = (&tls_cert, &tls_key) {
        let read = |p: &PathBuf| {
            std::fs::read(p).map_err(|e| anyhow::anyhow!("cannot read {}: {e}", p.display()))
        };
        let identity = tonic::transport::Identity::from_pem(read(cert)?, read(key)?);
        server = server.tls_config(tonic::transport::ServerTlsConfig::new().identity(identity))?;
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
        tls = tls_cert.is_some(),
        token = token.is_some(),
        "serving xDS"
    );
    server
        .add_service(tonic::service::interceptor::InterceptedService::new(
            cp.xds().service(),
            istiod_core::xds_server::bearer_check(token),
        ))
        .serve_with_incoming_shutdown(
            tokio_stream::wrappers::TcpListenerStream::new(listener),
            async {
                let _ = tokio::signal::ctrl_c().await;
            },
        )
        .await?;
    Ok(())
}
