//! The Kubernetes API server as a source of istiod-core's config, registry and identity, as
//! istiod takes them: `connect` makes the client (a kubeconfig file, or the pod's own service
//! account in a cluster).

pub mod gateway_deploy;
pub mod gateway_status;
pub mod identity;
pub mod ip_allocate;
pub mod source;
pub mod status;

use std::path::{Path, PathBuf};

/// Where the API server is: `serve --kubeconfig FILE` or `serve --in-cluster`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApiServer {
    Kubeconfig(PathBuf),
    InCluster,
}

impl ApiServer {
    /// From `serve`'s flags; `None` when config comes from files only.
    pub fn from_flags(kubeconfig: Option<&Path>, in_cluster: bool) -> Option<ApiServer> {
        match (kubeconfig, in_cluster) {
            (Some(path), _) => Some(ApiServer::Kubeconfig(path.to_path_buf())),
            (None, true) => Some(ApiServer::InCluster),
            (None, false) => None,
        }
    }
}

impl std::fmt::Display for ApiServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ApiServer::Kubeconfig(path) => write!(f, "--kubeconfig {}", path.display()),
            ApiServer::InCluster => f.write_str("--in-cluster"),
        }
    }
}

/// Why no client could be made, naming the flag that asked for one.
#[derive(Debug, thiserror::Error)]
#[error("{from}: {reason}")]
pub struct ConnectError {
    pub from: String,
    pub reason: String,
}

/// A client for `server`. Nothing is sent yet: the first request (the watches' lists) is where
/// an unreachable server shows.
pub async fn connect(server: &ApiServer) -> Result<kube::Client, ConnectError> {
    let fail = |reason: String| ConnectError {
        from: server.to_string(),
        reason,
    };
    let config = match server {
        ApiServer::Kubeconfig(path) => {
            let file = kube::config::Kubeconfig::read_from(path)
                .map_err(|e| fail(format!("not a readable kubeconfig: {e}")))?;
            kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| fail(e.to_string()))?
        }
        ApiServer::InCluster => kube::Config::incluster().map_err(|e| {
            fail(format!(
                "not in a Kubernetes pod (KUBERNETES_SERVICE_HOST and the service account's token and CA): {e}"
            ))
        })?,
    };
    kube::Client::try_from(config).map_err(|e| fail(e.to_string()))
}
