use std::path::PathBuf;

use clap::{Parser, Subcommand};
use istiod_core::config::{ServeArgs, ServeConfig};

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
        // Colours for a terminal only: a log file or `kubectl logs` gets plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match Cli::parse().command {
        Command::Validate { dir, domain_suffix } => {
            std::process::exit(validate(&dir, &domain_suffix))
        }
        Command::Serve(args) => {
            let cfg = ServeConfig::new(*args, &istiod_core::config::process_env)?;
            let mut shutdown = Box::pin(shutdown_signal());
            // Polled once now, so the handlers are in place before serving is announced.
            let _ = futures::poll!(shutdown.as_mut());
            istiod_core::serve::serve(cfg, shutdown)
                .await?
                .wait()
                .await?;
            Ok(())
        }
    }
}

/// SIGTERM (how Kubernetes stops a pod) or SIGINT.
async fn shutdown_signal() {
    if let Err(e) = mesh_common::tasks::stop_signal().await {
        tracing::error!(error = %e, "cannot install the SIGTERM handler; SIGINT only");
        let _ = tokio::signal::ctrl_c().await;
    }
}
