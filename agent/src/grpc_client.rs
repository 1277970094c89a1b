//! The agent's gRPC client to Istio's services: the control plane's ADS (for `xds_proxy`) and the
//! CA's `IstioCertificateService` (for `identity`). One dialer (TLS with the configured root and
//! server name, keepalives), the call metadata (bearer token, ClusterID, `*_HEADER_*`) and the
//! retry backoff. Mirrors the dial options of Istio's `pkg/istio-agent/xds_proxy.go` and
//! `security/pkg/nodeagent/caclient`.

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
        let mut tls = tonic::transport::ClientTlsConfig::new().domain_name(cfg.server_name.clone());
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
                tls.ca_certificate(tonic::transport::Certificate::from_pem(pem))
            }
        };
        endpoint = endpoint
            .tls_config(tls)
            .map_err(|e| Status::internal(format!("TLS to {address}: {e}")))?;
    }
    let mut metadata = Vec::new();
    if let Ok(token) = std::fs::read_to_string(&cfg.token_path)
        && let Ok(v) = format!("Bearer {}", token.trim()).parse()
    {
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

    #[test]
    fn backoff_grows_caps_and_jitters() {
        assert_eq!(Backoff::CONTROL_PLANE.after(0), std::time::Duration::ZERO);
        let one = Backoff::CONTROL_PLANE.after(1).as_millis();
        assert!((150..=250).contains(&one), "{one}");
        let many = Backoff::CONTROL_PLANE.after(30).as_millis();
        assert!((11_250..=18_750).contains(&many), "{many}");
    }
}
