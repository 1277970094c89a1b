//! The control plane the agent embeds: istiod-core in process (the default without a
//! discoveryAddress), with its local CA. The one place the agent meets istiod-core: the xDS proxy
//! forwards Envoy's streams to [`InProcess`], the workload certificate is signed by
//! [`EmbeddedSigner`]; everything else the two share comes from `mesh_common`.

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DiscoveryRequest};
use futures::{Stream, StreamExt};
use istiod_core::ca::Ca;
use istiod_core::xds_server::{Requests, XdsServer};
use mesh_common::identity::Identity;
use mesh_common::tasks::Supervisor;
use prost::Message;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

use crate::config::embedded::EmbeddedSettings;
use crate::identity::Signer;

/// The embedded control plane refused to start (its config did not load).
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct EmbeddedError(#[from] istiod_core::Error);

/// Largest response the in-process control plane sends.
pub const MAX_RESPONSE_BYTES: usize = istiod_core::xds_server::MAX_RESPONSE_BYTES;

/// istiod-core's xDS server in this process: Envoy's streams are served without a network hop.
/// It holds the control plane, whose snapshots the server streams.
#[derive(Clone)]
pub struct InProcess {
    server: XdsServer,
    _control_plane: Arc<istiod_core::ControlPlane>,
}

impl InProcess {
    fn of(control_plane: Arc<istiod_core::ControlPlane>) -> InProcess {
        InProcess {
            server: control_plane.xds(),
            _control_plane: control_plane,
        }
    }
}

/// A stream of encoded xDS responses.
pub type ResponseStream = Pin<Box<dyn Stream<Item = Result<Bytes, Status>> + Send>>;

/// Decodes Envoy's requests for the in-process server, which works on typed messages.
fn decoded<M: Message + Default + Send + 'static>(
    requests: ReceiverStream<Bytes>,
) -> impl Stream<Item = Result<M, Status>> + Send + 'static {
    requests.map(|b| M::decode(b).map_err(|e| Status::invalid_argument(e.to_string())))
}

impl InProcess {
    /// A control plane fed only by its in-memory store (tests).
    pub fn in_memory() -> Result<InProcess, EmbeddedError> {
        let cp = istiod_core::ControlPlane::in_memory(istiod_core::DEFAULT_DOMAIN_SUFFIX)?;
        Ok(InProcess::of(cp))
    }

    /// One of Envoy's streams (`delta`: Delta xDS), its requests as Envoy encoded them.
    pub fn open(&self, delta: bool, requests: ReceiverStream<Bytes>) -> ResponseStream {
        let requests = if delta {
            Requests::Delta(Box::pin(decoded::<DeltaDiscoveryRequest>(requests)))
        } else {
            Requests::Sotw(Box::pin(decoded::<DiscoveryRequest>(requests)))
        };
        let out = self
            .server
            .open(requests, istiod_core::autoregister::Caller::InProcess);
        Box::pin(out.map(|r| r.map(|m| m.to_bytes())))
    }
}

/// Opens the embedded control plane on `config_dir` (and the mesh config file), fails if its
/// config does not load, and starts its config watch among `tasks`.
pub fn start(
    config_dir: &Path,
    mesh_file: Option<&PathBuf>,
    trust_domain: &str,
    settings: &EmbeddedSettings,
    tasks: &mut Supervisor,
) -> Result<InProcess, EmbeddedError> {
    let cp = istiod_core::ControlPlane::open(istiod_core::Settings {
        config_dir: Some(config_dir.to_path_buf()),
        mesh_file: mesh_file.cloned(),
        domain_suffix: istiod_core::DEFAULT_DOMAIN_SUFFIX.to_string(),
        trust_domain: trust_domain.to_string(),
        scope_gateway_to_namespace: settings.scope_gateway_to_namespace,
        cache_check: settings.cache_check,
        ..istiod_core::Settings::default()
    })?;
    tasks.spawn_forever("config-watch", cp.clone().watch(settings.debounce));
    Ok(InProcess::of(cp))
}

/// Signs the workload's CSRs with the local CA kept in a directory: the agent's identity is its
/// own configuration (one machine, one operator).
pub struct EmbeddedSigner {
    pub ca: Arc<Ca>,
    pub identity: Identity,
}

impl EmbeddedSigner {
    /// The CA in `ca_dir` (made there on first use) for `identity`'s trust domain, able to sign
    /// certificates of at least `ttl`.
    pub fn open(ca_dir: &Path, identity: &Identity, ttl: Duration) -> Result<Self, String> {
        let ca = Ca::load_or_create(
            ca_dir,
            &identity.trust_domain,
            ttl.max(istiod_core::ca::DEFAULT_TTL),
        )
        .map_err(|e| e.to_string())?;
        Ok(EmbeddedSigner {
            ca: Arc::new(ca),
            identity: identity.clone(),
        })
    }
}

impl Signer for EmbeddedSigner {
    async fn sign(&self, csr_pem: String, ttl: Duration) -> Result<Vec<String>, String> {
        let ttl = i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX);
        self.ca
            .sign(&csr_pem, &self.identity, ttl)
            .map_err(|e| e.to_string())
    }
}
