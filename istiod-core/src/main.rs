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
    } = Cli::parse().command;
    let cp = istiod_core::ControlPlane::load(&config_dir, &domain_suffix)?;
    tokio::spawn(cp.clone().watch(Duration::from_secs(1)));
    let listener = tokio::net::TcpListener::bind(grpc_addr).await?;
    tracing::info!(addr = %listener.local_addr()?, "serving xDS");
    tonic::transport::Server::builder()
        .add_service(cp.xds().service())
        .serve_with_incoming_shutdown(
            tokio_stream::wrappers::TcpListenerStream::new(listener),
            async {
                let _ = tokio::signal::ctrl_c().await;
            },
        )
        .await?;
    Ok(())
}
