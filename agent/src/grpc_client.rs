//! The agent's gRPC client to Istio's services: the control plane's ADS (for `xds_proxy`) and the
//! CA's `IstioCertificateService` (for `identity`). One dialer (TLS with the configured root and
//! server name, keepalives), the call metadata (bearer token, ClusterID, `*_HEADER_*`) and the
//! retry backoff. Mirrors the dial options of Istio's `pkg/istio-agent/xds_proxy.go` and
//! `security/pkg/nodeagent/caclient`.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use tonic::Status;
use tonic::metadata::{Ascii, MetadataKey, MetadataValue};

use crate::config::{RootCa, XdsClientConfig};

/// Adds the bearer token and the configured metadata to every call.
#[derive(Clone)]
pub struct CallMetadata(Vec<(MetadataKey<Ascii>, MetadataValue<Ascii>)>);

impl tonic::service::Interceptor for CallMetadata {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, Status> {
        for (k, v) in &self.0 {
            req.metadata_mut().insert(k.clone(), v.clone());
        }
        Ok(req)
    }
}

pub type Channel =
    tonic::service::interceptor::InterceptedService<tonic::transport::Channel, CallMetadata>;

/// Dials `address`: the control plane for one Envoy stream, or the CA for one request. The root
/// certificate and the token are read on every connect, so rotated files take effect without a
/// restart.
pub async fn dial(address: &str, cfg: &XdsClientConfig) -> Result<Channel, Status> {
    let scheme = if cfg.tls { "https" } else { "http" };
    let uri = format!("{scheme}://{address}");
    let mut endpoint = tonic::transport::Endpoint::from_shared(uri.clone())
        .map_err(|e| Status::invalid_argument(format!("control plane address {address}: {e}")))?
        .connect_timeout(cfg.connect_timeout)
        .keep_alive_while_idle(true)
        .http2_keep_alive_interval(std::time::Duration::from_secs(30))
        .keep_alive_timeout(std::time::Duration::from_secs(10));
    // What the server's certificate is checked against, for the error when it does not pass.
    let mut verified_by = None;
    if cfg.tls {
        // The handshake is bounded too: `connect_timeout` covers only the TCP connect, and a
        // server that accepts and then drops every packet would hold the dial forever.
        let mut tls = tonic::transport::ClientTlsConfig::new()
            .domain_name(cfg.server_name.clone())
            .timeout(cfg.connect_timeout);
        tls = match &cfg.root_ca {
            RootCa::System => {
                verified_by = Some(format!(
                    "the system's roots for the server name {}",
                    cfg.server_name
                ));
                tls.with_native_roots()
            }
            RootCa::Files(files) => {
                let Some((file, pem)) = files
                    .iter()
                    .find_map(|f| std::fs::read(f).ok().map(|pem| (f, pem)))
                else {
                    return Err(Status::unavailable(format!(
                        "no root certificate to verify the control plane: tried {files:?} (set XDS_ROOT_CA)"
                    )));
                };
                verified_by = Some(format!(
                    "the root in {} for the server name {}",
                    file.display(),
                    cfg.server_name
                ));
                // Only the bundle's usable roots: one garbage or expired entry must not make
                // the good ones unusable, and a file with none is an error that names it.
                let bundle = mesh_common::identity::TrustBundle::parse(
                    &String::from_utf8_lossy(&pem),
                    SystemTime::now(),
                );
                if bundle.roots.is_empty() {
                    return Err(Status::unavailable(format!(
                        "root bundle {}: no usable certificate ({})",
                        file.display(),
                        bundle.dropped.join("; ")
                    )));
                }
                for why in &bundle.dropped {
                    tracing::warn!(file = %file.display(), entry = %why, "root bundle entry left out");
                }
                tls.ca_certificates(
                    bundle
                        .roots
                        .iter()
                        .map(tonic::transport::Certificate::from_pem),
                )
            }
        };
        endpoint = endpoint
            .tls_config(tls)
            .map_err(|e| Status::internal(format!("TLS to {address}: {e}")))?;
    }
    let mut metadata = Vec::new();
    if let Some(token) =
        read_token(&cfg.token_path).map_err(|e| Status::unauthenticated(e.to_string()))?
    {
        let v = format!("Bearer {token}").parse().map_err(|_| {
            Status::unauthenticated(
                TokenError::NotAHeader {
                    path: cfg.token_path.clone(),
                }
                .to_string(),
            )
        })?;
        metadata.push((MetadataKey::from_static("authorization"), v));
    }
    for (k, v) in &cfg.headers {
        if let (Ok(k), Ok(v)) = (k.parse::<MetadataKey<Ascii>>(), v.parse()) {
            metadata.push((k, v));
        }
    }
    let channel = endpoint.connect().await.map_err(|e| {
        let checked = verified_by
            .map(|v| format!(" (TLS: its certificate is verified against {v})"))
            .unwrap_or_default();
        Status::unavailable(format!("control plane {uri}: {}{checked}", causes(&e)))
    })?;
    Ok(tonic::service::interceptor::InterceptedService::new(
        channel,
        CallMetadata(metadata),
    ))
}

/// The largest token file read: a Kubernetes service-account token is a few KiB (its claims and
/// one signature); anything far larger is not a token and would be sent in every dial's headers.
pub const MAX_TOKEN_BYTES: u64 = 64 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("token file {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("token file {} is over {MAX_TOKEN_BYTES} bytes: not a service-account token", path.display())]
    TooLarge { path: PathBuf },
    #[error("token file {} is not usable as an HTTP header (non-ASCII or control characters)", path.display())]
    NotAHeader { path: PathBuf },
}

/// The bearer token in `path`, read afresh (kubelet rotates it in place or by swapping the
/// volume's `..data` symlink) and at most `MAX_TOKEN_BYTES`; `None` when there is no file or it
/// is empty (no `authorization` header, as Istio's agent without a token).
pub fn read_token(path: &Path) -> Result<Option<String>, TokenError> {
    use std::io::Read;
    let read_err = |source| TokenError::Read {
        path: path.to_path_buf(),
        source,
    };
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(read_err(e)),
    };
    let mut bytes = Vec::new();
    file.take(MAX_TOKEN_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(read_err)?;
    if bytes.len() as u64 > MAX_TOKEN_BYTES {
        return Err(TokenError::TooLarge {
            path: path.to_path_buf(),
        });
    }
    let text = String::from_utf8(bytes).map_err(|_| TokenError::NotAHeader {
        path: path.to_path_buf(),
    })?;
    let token = text.trim();
    Ok((!token.is_empty()).then(|| token.to_string()))
}

/// What to say of the token in `path` when its JWT `exp` claim is past at `now`: the file and
/// how long ago it expired; `None` when it has not, or the file holds no readable JWT. The
/// control plane refuses such a token with a bare "authentication failure"; on a VM the token
/// `istioctl x workload entry configure` wrote lasts `--tokenDuration` (1 h by default), so this
/// names the usual cause of a VM that stopped getting certificates.
pub fn expired_token(path: &Path, now: std::time::SystemTime) -> Option<String> {
    use base64::Engine as _;
    let token = read_token(path).ok()??;
    let payload = token.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    let claims: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    let exp = claims.get("exp")?.as_u64()?;
    let now = now.duration_since(std::time::UNIX_EPOCH).ok()?.as_secs();
    (exp <= now).then(|| {
        format!(
            "the token in {} expired {} s ago (its exp claim is {exp}); give the workload a new \
             one (on a VM: istioctl x workload entry configure, --tokenDuration)",
            path.display(),
            now - exp
        )
    })
}

/// `e` and its sources, outermost first: tonic's own message ("transport error") says nothing of
/// the cause, such as the certificate the server presented being refused.
fn causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut next = e.source();
    while let Some(cause) = next {
        let cause_text = cause.to_string();
        // Some errors repeat their source in their own message.
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        next = cause.source();
    }
    text
}

/// Exponential backoff between retries: nothing before the first failure, `first` after it,
/// doubling up to `max`, scaled by a random factor within 1 ± `jitter` so that many agents do not
/// retry in step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    pub first: Duration,
    pub max: Duration,
    pub jitter: f64,
}

impl Backoff {
    /// Redialing the control plane: 200 ms doubling to 15 s, ±25%.
    pub const CONTROL_PLANE: Backoff = Backoff {
        first: Duration::from_millis(200),
        max: Duration::from_secs(15),
        jitter: 0.25,
    };
    /// Asking the CA again after a failed renewal: 1 s doubling to 30 s.
    pub const CA: Backoff = Backoff {
        first: Duration::from_secs(1),
        max: Duration::from_secs(30),
        jitter: 0.0,
    };

    /// The delay after `failures` consecutive failures.
    pub fn after(&self, failures: u32) -> Duration {
        if failures == 0 {
            return Duration::ZERO;
        }
        let doublings = failures.saturating_sub(1).min(16);
        let base = self.first.saturating_mul(1 << doublings).min(self.max);
        if self.jitter == 0.0 {
            return base;
        }
        base.mul_f64(1.0 - self.jitter + 2.0 * self.jitter * unit_random())
    }
}

/// A number in [0, 1) from the clock: enough to spread retries and renewals, not for secrets.
pub fn unit_random() -> f64 {
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    f64::from(nanos % 1_000_000) / 1_000_000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client(token_path: PathBuf) -> XdsClientConfig {
        XdsClientConfig {
            tls: false,
            root_ca: RootCa::Files(vec![]),
            server_name: "istiod.istio-system.svc".into(),
            token_path,
            headers: vec![],
            connect_timeout: Duration::from_secs(1),
            max_response_bytes: 1 << 20,
        }
    }

    /// A 10 MB token file is refused before any dial, by name and with the limit; before, it
    /// was read whole on every dial and sent as a header, and no error named it.
    #[tokio::test]
    async fn a_token_file_is_read_bounded_and_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("istio-token");
        std::fs::write(&path, vec![b'a'; 10 << 20]).unwrap();
        let e = dial("127.0.0.1:9", &client(path.clone()))
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");
        assert!(e.message().contains(&path.display().to_string()), "{e:?}");
        assert!(e.message().contains("65536 bytes"), "{e:?}");
        // At the limit it is still a token; a trailing newline is not part of it.
        std::fs::write(&path, vec![b'a'; 64 * 1024]).unwrap();
        assert_eq!(read_token(&path).unwrap().map(|t| t.len()), Some(64 * 1024));
        std::fs::write(&path, "header.claims.signature\n").unwrap();
        assert_eq!(
            read_token(&path).unwrap().as_deref(),
            Some("header.claims.signature")
        );
        // Not a header value: named too, never silently dropped.
        std::fs::write(&path, "a\u{7f}b").unwrap();
        let e = dial("127.0.0.1:9", &client(path.clone()))
            .await
            .unwrap_err();
        assert!(e.message().contains(&path.display().to_string()), "{e:?}");
        // No file (or an empty one): no token, as before.
        assert!(read_token(&dir.path().join("absent")).unwrap().is_none());
        std::fs::write(&path, "\n").unwrap();
        assert!(read_token(&path).unwrap().is_none());
    }

    #[test]
    fn backoff_grows_caps_and_jitters() {
        assert_eq!(Backoff::CONTROL_PLANE.after(0), std::time::Duration::ZERO);
        let one = Backoff::CONTROL_PLANE.after(1).as_millis();
        assert!((150..=250).contains(&one), "{one}");
        let many = Backoff::CONTROL_PLANE.after(30).as_millis();
        assert!((11_250..=18_750).contains(&many), "{many}");
    }

    /// An expired JWT is named with its file; a live one, a non-JWT and a missing file are not.
    #[test]
    fn an_expired_token_is_named_with_its_file() {
        use base64::Engine as _;
        let dir = tempfile::tempdir().unwrap();
        let jwt = |exp: u64| {
            let b = |v: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v);
            format!(
                "{}.{}.sig",
                b(r#"{"alg":"RS256"}"#),
                b(&format!(
                    r#"{{"sub":"system:serviceaccount:vm:vmapp","exp":{exp}}}"#
                ))
            )
        };
        let now = std::time::UNIX_EPOCH + Duration::from_secs(2_000_000_000);
        let path = dir.path().join("istio-token");
        std::fs::write(&path, jwt(2_000_000_000 - 3600)).unwrap();
        let said = expired_token(&path, now).unwrap();
        assert!(
            said.contains(&path.display().to_string()) && said.contains("expired 3600 s ago"),
            "{said}"
        );
        std::fs::write(&path, jwt(2_000_000_000 + 60)).unwrap();
        assert_eq!(expired_token(&path, now), None);
        std::fs::write(&path, "not-a-jwt").unwrap();
        assert_eq!(expired_token(&path, now), None);
        assert_eq!(expired_token(&dir.path().join("none"), now), None);
    }
}
