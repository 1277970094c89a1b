//! The SDS server Envoy reads its workload certificate from, on the unix socket
//! `./var/run/secrets/workload-spiffe-uds/socket` (Istio's `security/pkg/nodeagent/sds`).
//!
//! Resources: `default` (chain and key), `ROOTCA` (trust bundle), and `file-cert:<cert>~<key>` /
//! `file-root:<bundle>` for files inside an allow-list of directories. Every stream is pushed
//! again when the certificate rotates or the root changes.
//!
//! Stricter than Istio: the directory is 0700 and the socket 0600, both owned by the proxy uid,
//! and every connection's peer credentials (SO_PEERCRED) must be the proxy uid or root.

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::{DataSource, data_source};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    CertificateValidationContext, Secret, TlsCertificate, secret,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use envoy_types::pb::envoy::service::secret::v3::secret_discovery_service_server::{
    SecretDiscoveryService, SecretDiscoveryServiceServer,
};
use envoy_types::util::pack_any;
use futures::{Stream, StreamExt};
use mesh_common::watch::{FileWatch, Watched};
use mesh_common::xds::{Answer, Step, Subscription};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::mpsc;
use tonic::{Request, Response, Status, Streaming};

use crate::identity::CertWatch;

pub const SOCKET_PATH: &str = "./var/run/secrets/workload-spiffe-uds/socket";
pub const SECRET_TYPE: &str =
    "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret";
const DEFAULT: &str = "default";
const ROOTCA: &str = "ROOTCA";
const SYSTEM_ROOTS: &str = "/etc/ssl/certs/ca-certificates.crt";

#[derive(Debug, thiserror::Error)]
#[error("SDS socket {path}: {source}")]
pub struct SdsError {
    pub path: PathBuf,
    pub source: std::io::Error,
}

/// Creates the socket's directory (0700) and the socket (0600), both owned by `owner`
/// (`uds::bind`; in a pod the directory is an emptyDir the agent cannot chmod).
pub fn bind(path: &Path, owner: Option<u32>) -> Result<UnixListener, SdsError> {
    crate::uds::bind(path, owner, true).map_err(|source| SdsError {
        path: path.to_path_buf(),
        source,
    })
}

fn inline(bytes: &[u8]) -> Option<DataSource> {
    Some(DataSource {
        specifier: Some(data_source::Specifier::InlineBytes(bytes.to_vec())),
        ..Default::default()
    })
}

fn tls_secret(name: &str, chain: &[u8], key: &[u8]) -> Secret {
    Secret {
        name: name.to_string(),
        r#type: Some(secret::Type::TlsCertificate(TlsCertificate {
            certificate_chain: inline(chain),
            private_key: inline(key),
            ..Default::default()
        })),
    }
}

fn root_secret(name: &str, bundle: &[u8]) -> Secret {
    Secret {
        name: name.to_string(),
        r#type: Some(secret::Type::ValidationContext(
            CertificateValidationContext {
                trusted_ca: inline(bundle),
                ..Default::default()
            },
        )),
    }
}

/// Resolves `raw` and checks it lies inside one of `dirs`.
fn allowed_file(raw: &str, dirs: &[PathBuf]) -> Result<PathBuf, Status> {
    let path = std::fs::canonicalize(raw)
        .map_err(|e| Status::not_found(format!("SDS file {raw:?}: {e}")))?;
    let inside = dirs
        .iter()
        .filter_map(|d| std::fs::canonicalize(d).ok())
        .any(|d| path.starts_with(d));
    if inside {
        Ok(path)
    } else {
        Err(Status::permission_denied(format!(
            "SDS file {raw:?} is outside the allowed directories {dirs:?}"
        )))
    }
}

fn read(path: &Path) -> Result<Vec<u8>, Status> {
    std::fs::read(path).map_err(|e| Status::not_found(format!("SDS file {}: {e}", path.display())))
}

/// The secrets for `names` (`None` while the workload certificate is not there yet), and the
/// names refused with why. One bad file name (missing, outside the allowed directories) is left
/// out of the answer, not the end of the stream: the other secrets, `default` and `ROOTCA`
/// included, keep flowing, and the refused one is served once its file is there. Public for
/// the fuzz target (`fuzz/fuzz_targets/sds_names.rs`).
pub fn secrets(
    names: &[String],
    certs: &CertWatch,
    dirs: &[PathBuf],
) -> (Option<Vec<Secret>>, Vec<(String, Status)>) {
    let mut refused = Vec::new();
    let cert = certs.borrow().clone();
    let mut out = Vec::with_capacity(names.len());
    for name in names {
        match secret(name, cert.as_deref(), dirs) {
            Ok(Some(s)) => out.push(s),
            Ok(None) => return (None, refused),
            Err(status) => refused.push((name.clone(), status)),
        }
    }
    (Some(out), refused)
}

/// One secret; `Ok(None)` when it is the workload certificate and that is not there yet.
fn secret(
    name: &str,
    cert: Option<&crate::identity::WorkloadCert>,
    dirs: &[PathBuf],
) -> Result<Option<Secret>, Status> {
    let secret = if name == DEFAULT {
        let Some(c) = cert else { return Ok(None) };
        tls_secret(name, c.chain_pem.as_bytes(), c.key_pem.as_bytes())
    } else if name == ROOTCA {
        let Some(c) = cert else { return Ok(None) };
        root_secret(name, c.root_pem.as_bytes())
    } else if let Some(spec) = name.strip_prefix("file-cert:") {
        let (cert_path, key_path) = spec.split_once('~').ok_or_else(|| {
            Status::invalid_argument(format!(
                "SDS resource {name:?}: expected file-cert:<cert path>~<key path>"
            ))
        })?;
        let chain = read(&allowed_file(cert_path, dirs)?)?;
        let key = read(&allowed_file(key_path, dirs)?)?;
        tls_secret(name, &chain, &key)
    } else if let Some(path) = name.strip_prefix("file-root:") {
        let path = if path == "system" {
            PathBuf::from(SYSTEM_ROOTS)
        } else {
            allowed_file(path, dirs)?
        };
        root_secret(name, &read(&path)?)
    } else {
        return Err(Status::invalid_argument(format!(
            "unknown SDS resource {name:?}: expected default, ROOTCA, file-cert:... or file-root:..."
        )));
    };
    Ok(Some(secret))
}

/// The files the `file-cert:` and `file-root:` resources among `names` read.
pub fn watched_files(names: &[String]) -> Vec<Watched> {
    names
        .iter()
        .filter_map(|n| {
            n.strip_prefix("file-cert:")
                .or_else(|| n.strip_prefix("file-root:"))
        })
        .flat_map(|spec| spec.split('~'))
        .map(|p| Watched::File(PathBuf::from(p)))
        .collect()
}

pub struct SdsService {
    certs: CertWatch,
    file_dirs: Arc<Vec<PathBuf>>,
    version: Arc<AtomicU64>,
}

impl SdsService {
    pub fn new(certs: CertWatch, file_dirs: Vec<PathBuf>) -> SecretDiscoveryServiceServer<Self> {
        SecretDiscoveryServiceServer::new(SdsService {
            certs,
            file_dirs: Arc::new(file_dirs),
            version: Arc::new(AtomicU64::new(0)),
        })
    }
}

type ResponseStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl SecretDiscoveryService for SdsService {
    type DeltaSecretsStream = ResponseStream<DeltaDiscoveryResponse>;
    type StreamSecretsStream = ResponseStream<DiscoveryResponse>;

    async fn delta_secrets(
        &self,
        _: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaSecretsStream>, Status> {
        Err(Status::unimplemented("SDS is served over StreamSecrets"))
    }

    async fn fetch_secrets(
        &self,
        _: Request<DiscoveryRequest>,
    ) -> Result<Response<DiscoveryResponse>, Status> {
        Err(Status::unimplemented("SDS is served over StreamSecrets"))
    }

    async fn stream_secrets(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamSecretsStream>, Status> {
        let mut requests = request.into_inner();
        let (tx, rx) = mpsc::channel(4);
        let mut certs = self.certs.clone();
        let dirs = self.file_dirs.clone();
        let version = self.version.clone();
        tokio::spawn(async move {
            let mut sub = Subscription::<String>::default();
            let mut owed = false;
            let mut files = FileWatch::new(Vec::new());
            let mut tick = tokio::time::interval(Duration::from_secs(2));
            loop {
                tokio::select! {
                    req = requests.next() => {
                        let Some(Ok(req)) = req else { break };
                        let error = req.error_detail.as_ref().map(|e| e.message.as_str());
                        match sub.on_request(&req.response_nonce, error, req.resource_names) {
                            Step::Ignore(Answer::Nack(why)) => {
                                tracing::warn!(resources = ?sub.names, error = %why, "Envoy rejected a secret (NACK)");
                            }
                            Step::Ignore(_) => {}
                            Step::Respond(_) => owed = true,
                        }
                    }
                    changed = certs.changed() => {
                        if changed.is_err() {
                            break;
                        }
                        owed = true;
                    }
                    _ = tick.tick() => {
                        files.set_watched(watched_files(&sub.names));
                        if let Some(now) = files.check() {
                            files.mark_seen(now);
                            // Changed, or appeared after being refused: (re)send.
                            owed = true;
                        }
                    }
                }
                if !owed || sub.names.is_empty() {
                    continue;
                }
                certs.borrow_and_update();
                let (served, refused) = secrets(&sub.names, &certs, &dirs);
                for (name, status) in &refused {
                    tracing::warn!(resource = %name, error = %status.message(), "SDS resource refused; the others are served");
                }
                match served {
                    Some(list) if list.is_empty() => owed = false,
                    Some(list) => {
                        let n = version.fetch_add(1, Ordering::Relaxed) + 1;
                        sub.nonce_sent = format!("{n}");
                        let response = DiscoveryResponse {
                            version_info: format!("{n}"),
                            resources: list.into_iter().map(pack_any).collect(),
                            type_url: SECRET_TYPE.to_string(),
                            nonce: sub.nonce_sent.clone(),
                            ..Default::default()
                        };
                        owed = false;
                        if tx.send(Ok(response)).await.is_err() {
                            break;
                        }
                    }
                    // Not yet: the push follows when the certificate arrives.
                    None => {}
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }
}

/// Serves SDS until `shutdown` resolves.
pub async fn serve(
    listener: UnixListener,
    allowed_uids: Vec<u32>,
    certs: CertWatch,
    file_dirs: Vec<PathBuf>,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    tonic::transport::Server::builder()
        .add_service(SdsService::new(certs, file_dirs))
        .serve_with_incoming_shutdown(
            crate::uds::authorized(listener, allowed_uids, "SDS"),
            shutdown,
        )
        .await
}

/// A gRPC channel to the SDS socket at `path`, as Envoy opens one (for tests and tools).
pub async fn connect(
    path: std::path::PathBuf,
) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    tonic::transport::Endpoint::from_static("http://sds")
        .connect_with_connector(tower::service_fn(move |_| {
            let p = path.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(UnixStream::connect(p).await?))
            }
        }))
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::KeyAlgorithm;
    use crate::identity::{WorkloadCert, key_and_csr, verify_chain};
    use envoy_types::pb::envoy::service::secret::v3::secret_discovery_service_client::SecretDiscoveryServiceClient;
    use istiod_core::ca::Ca;
    use mesh_common::identity::Identity;
    use prost::Message;

    fn cert(ca: &Ca) -> Arc<WorkloadCert> {
        let id = Identity::new("cluster.local", "shop", "web").unwrap();
        let (key, csr) = key_and_csr(KeyAlgorithm::EcdsaP256, &id).unwrap();
        let chain = ca.sign(&csr, &id, 3600).unwrap();
        Arc::new(verify_chain(&chain, &key.serialize_pem(), Some(&id)).unwrap())
    }

    fn request(names: &[&str], nonce: &str, nack: bool) -> DiscoveryRequest {
        DiscoveryRequest {
            resource_names: names.iter().map(|s| s.to_string()).collect(),
            type_url: SECRET_TYPE.to_string(),
            response_nonce: nonce.to_string(),
            error_detail: nack.then(|| envoy_types::pb::google::rpc::Status {
                message: "bad".into(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn names(resp: &DiscoveryResponse) -> Vec<String> {
        resp.resources
            .iter()
            .map(|a| Secret::decode(a.value.as_slice()).unwrap().name)
            .collect()
    }

    #[tokio::test]
    async fn serves_and_pushes_rotations_over_the_socket() {
        let dir = tempfile::tempdir().unwrap();
        let ca = Ca::load_or_create(
            &dir.path().join("ca"),
            "cluster.local",
            Duration::from_secs(7200),
        )
        .unwrap();
        let allowed = dir.path().join("certs");
        std::fs::create_dir_all(&allowed).unwrap();
        std::fs::write(allowed.join("root.pem"), ca.root_pem()).unwrap();
        std::fs::write(dir.path().join("outside.pem"), ca.root_pem()).unwrap();

        let path = dir.path().join("uds/socket");
        let listener = bind(&path, None).unwrap();
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(path.parent().unwrap()), 0o700);
        assert_eq!(mode(&path), 0o600);
        let (tx, rx) = tokio::sync::watch::channel(None);
        let me = nix::unistd::geteuid().as_raw();
        tokio::spawn(serve(
            listener,
            vec![me],
            rx,
            vec![allowed.clone()],
            std::future::pending(),
        ));

        let channel = connect(path.clone()).await.unwrap();
        let mut client = SecretDiscoveryServiceClient::new(channel);
        let (req_tx, req_rx) = mpsc::channel(8);
        let mut responses = client
            .stream_secrets(tokio_stream::wrappers::ReceiverStream::new(req_rx))
            .await
            .unwrap()
            .into_inner();
        req_tx
            .send(request(&["default", "ROOTCA"], "", false))
            .await
            .unwrap();
        // Nothing before the certificate exists; the push follows when it does.
        let early = tokio::time::timeout(Duration::from_millis(200), responses.next()).await;
        assert!(early.is_err(), "answered before there was a certificate");
        let first = cert(&ca);
        tx.send_replace(Some(first.clone()));
        let resp = responses.next().await.unwrap().unwrap();
        assert_eq!(names(&resp), vec!["default", "ROOTCA"]);
        let secret = Secret::decode(resp.resources[0].value.as_slice()).unwrap();
        let Some(secret::Type::TlsCertificate(tls)) = secret.r#type else {
            panic!("default is not a TLS certificate")
        };
        assert_eq!(tls.private_key, inline(first.key_pem.as_bytes()));

        // A NACK is not answered with the same thing again.
        req_tx
            .send(request(&["default", "ROOTCA"], &resp.nonce, true))
            .await
            .unwrap();
        let again = tokio::time::timeout(Duration::from_millis(200), responses.next()).await;
        assert!(again.is_err(), "resent after a NACK");

        // Rotation: pushed without being asked.
        tx.send_replace(Some(cert(&ca)));
        let pushed = responses.next().await.unwrap().unwrap();
        assert_ne!(pushed.nonce, resp.nonce);
        assert_eq!(names(&pushed), vec!["default", "ROOTCA"]);

        // File resources: inside the allow-list served, outside refused with a reason.
        let inside = format!("file-root:{}", allowed.join("root.pem").display());
        req_tx
            .send(request(&[&inside], &pushed.nonce, false))
            .await
            .unwrap();
        let resp = responses.next().await.unwrap().unwrap();
        assert_eq!(names(&resp), vec![inside.clone()]);
        // A name outside the allow-list is left out; the stream and the others go on.
        let outside = format!("file-root:{}", dir.path().join("outside.pem").display());
        std::fs::write(dir.path().join("outside.pem"), ca.root_pem()).unwrap();
        req_tx
            .send(request(&[&outside, &inside], &resp.nonce, false))
            .await
            .unwrap();
        let resp = responses.next().await.unwrap().unwrap();
        assert_eq!(names(&resp), vec![inside.clone()]);
        req_tx
            .send(request(&["default", &inside], &resp.nonce, false))
            .await
            .unwrap();
        let resp = responses.next().await.unwrap().unwrap();
        assert_eq!(names(&resp), vec!["default".to_string(), inside]);
    }

    fn trusted_ca(resp: &DiscoveryResponse, name: &str) -> Vec<u8> {
        resp.resources
            .iter()
            .map(|a| Secret::decode(a.value.as_slice()).unwrap())
            .find(|s| s.name == name)
            .and_then(|s| match s.r#type {
                Some(secret::Type::ValidationContext(v)) => v.trusted_ca,
                _ => None,
            })
            .and_then(|d| match d.specifier {
                Some(data_source::Specifier::InlineBytes(b)) => Some(b),
                _ => None,
            })
            .unwrap_or_else(|| panic!("no {name} validation context in {:?}", names(resp)))
    }

    /// CVE-2020-8664's class: a new root must reach every consumer of ROOTCA, not only the
    /// first or the one that also asked for `default`. Three streams (two asking for ROOTCA
    /// alone, as two validation contexts would) all get the new root pushed, unasked.
    #[tokio::test]
    async fn a_new_root_is_pushed_to_every_stream() {
        let dir = tempfile::tempdir().unwrap();
        let old = Ca::load_or_create(
            &dir.path().join("old"),
            "cluster.local",
            Duration::from_secs(7200),
        )
        .unwrap();
        let new = Ca::load_or_create(
            &dir.path().join("new"),
            "cluster.local",
            Duration::from_secs(7200),
        )
        .unwrap();
        let path = dir.path().join("uds/socket");
        let listener = bind(&path, None).unwrap();
        let (tx, rx) = tokio::sync::watch::channel(Some(cert(&old)));
        let me = nix::unistd::geteuid().as_raw();
        tokio::spawn(serve(
            listener,
            vec![me],
            rx,
            vec![],
            std::future::pending(),
        ));

        let mut streams = Vec::new();
        for asked in [&["default", "ROOTCA"][..], &["ROOTCA"], &["ROOTCA"]] {
            let mut client =
                SecretDiscoveryServiceClient::new(connect(path.clone()).await.unwrap());
            let (req_tx, req_rx) = mpsc::channel(8);
            let mut responses = client
                .stream_secrets(tokio_stream::wrappers::ReceiverStream::new(req_rx))
                .await
                .unwrap()
                .into_inner();
            req_tx.send(request(asked, "", false)).await.unwrap();
            let first = responses.next().await.unwrap().unwrap();
            assert_eq!(trusted_ca(&first, ROOTCA), old.root_pem().as_bytes());
            req_tx
                .send(request(asked, &first.nonce, false))
                .await
                .unwrap();
            streams.push((req_tx, responses));
        }

        tx.send_replace(Some(cert(&new)));
        for (i, (_, responses)) in streams.iter_mut().enumerate() {
            let pushed = tokio::time::timeout(Duration::from_secs(5), responses.next())
                .await
                .unwrap_or_else(|_| panic!("stream {i} never got the new root"))
                .unwrap()
                .unwrap();
            assert_eq!(
                trusted_ca(&pushed, ROOTCA),
                new.root_pem().as_bytes(),
                "stream {i}"
            );
        }
    }

    /// `file-root:`/`file-cert:` names are resolved before the allow-list is checked: a `..`
    /// that climbs out of the allowed directory, a symlink inside it pointing outside, and a
    /// symlinked subdirectory leading outside are all refused (PermissionDenied, naming the
    /// file), while the same file reached without leaving the directory is served.
    #[test]
    fn file_names_that_leave_the_allowed_directory_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let ca = Ca::load_or_create(
            &dir.path().join("ca"),
            "cluster.local",
            Duration::from_secs(7200),
        )
        .unwrap();
        let allowed = dir.path().join("allowed");
        std::fs::create_dir_all(allowed.join("sub")).unwrap();
        std::fs::write(allowed.join("root.pem"), ca.root_pem()).unwrap();
        let outside = dir.path().join("outside.pem");
        std::fs::write(&outside, ca.root_pem()).unwrap();
        std::os::unix::fs::symlink(&outside, allowed.join("link.pem")).unwrap();
        std::os::unix::fs::symlink(dir.path(), allowed.join("up")).unwrap();
        let (_tx, certs) = tokio::sync::watch::channel(None);
        let dirs = vec![allowed.clone()];
        let a = allowed.display();

        let escapes = [
            format!("file-root:{a}/../outside.pem"),
            format!("file-root:{a}/sub/../../outside.pem"),
            format!("file-root:{a}/link.pem"),
            format!("file-root:{a}/up/outside.pem"),
            format!("file-cert:{a}/link.pem~{a}/root.pem"),
            format!("file-cert:{a}/root.pem~{a}/../outside.pem"),
        ];
        for name in &escapes {
            let (served, refused) = secrets(std::slice::from_ref(name), &certs, &dirs);
            assert_eq!(served.as_deref().map(<[_]>::len), Some(0), "{name} served");
            let [(refused_name, status)] = &refused[..] else {
                panic!("{name}: refused {refused:?}")
            };
            assert_eq!(refused_name, name);
            assert_eq!(status.code(), tonic::Code::PermissionDenied, "{name}");
            assert!(status.message().contains("outside"), "{status:?}");
        }

        // The control: inside the directory, even spelled with `.` and `..`, it is served.
        let inside = [
            format!("file-root:{a}/root.pem"),
            format!("file-root:{a}/./sub/../root.pem"),
        ];
        for name in &inside {
            let (served, refused) = secrets(std::slice::from_ref(name), &certs, &dirs);
            assert!(refused.is_empty(), "{name}: {refused:?}");
            assert_eq!(served.unwrap().len(), 1, "{name}");
        }
    }
}
