//! Application probes rewritten by the injector (Istio's `ISTIO_KUBE_APP_PROBERS`, served by
//! `pilot/cmd/pilot-agent/status/server.go`): kubelet calls `:15020/app-health/<container>/<kind>`
//! and the agent runs the app's original httpGet, tcpSocket or grpc probe itself.
//!
//! Probes are dialled from 127.0.0.6 (`::6`), which istio-iptables never captures, to the pod IP
//! (or localhost with REWRITE_PROBE_LEGACY_LOCALHOST_DESTINATION). Kubelet semantics: 2xx and 3xx
//! succeed; same-host redirects are followed at most 10 times; a redirect to another host is not
//! followed (and counts as success, as kubelet does); bodies are read up to 10 KiB; HTTPS does not
//! verify the server's certificate (kubelet's InsecureSkipVerify). Nothing in the
//! kubelet's request can change what is dialled: only the configured probe is run.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use crate::config::probes::{Check, Probe};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};

const MAX_REDIRECTS: usize = 10;
const MAX_BODY: usize = 10 * 1024;

fn source_for(target: IpAddr) -> IpAddr {
    match target {
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::new(127, 0, 0, 6)),
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::new(0, 0, 0, 0, 0, 0, 0, 6)),
    }
}

async fn connect(target: SocketAddr) -> std::io::Result<tokio::net::TcpStream> {
    let socket = match target {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    socket.bind(SocketAddr::new(source_for(target.ip()), 0))?;
    socket.connect(target).await
}

/// Result of one probe: success, or why not.
pub type Outcome = Result<(), String>;

/// Accepts any server certificate: kubelet's HTTPS probes do not verify (InsecureSkipVerify).
#[derive(Debug)]
struct AcceptAnyCert(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AcceptAnyCert {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

fn tls_connector() -> Result<tokio_rustls::TlsConnector, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AcceptAnyCert(provider)))
        .with_no_client_auth();
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

async fn http_once(
    target: SocketAddr,
    path: &str,
    headers: &[(String, String)],
    tls: bool,
) -> Result<(u16, Option<String>), String> {
    let stream = connect(target)
        .await
        .map_err(|e| format!("connect {target}: {e}"))?;
    if !tls {
        return send(stream, target, path, headers).await;
    }
    let name = rustls::pki_types::ServerName::IpAddress(target.ip().into());
    let stream = tls_connector()?
        .connect(name, stream)
        .await
        .map_err(|e| format!("TLS to {target}: {e}"))?;
    send(stream, target, path, headers).await
}

async fn send<S>(
    io: S,
    target: SocketAddr,
    path: &str,
    headers: &[(String, String)],
) -> Result<(u16, Option<String>), String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let mut req = hyper::Request::builder()
        .method(hyper::Method::GET)
        .uri(path)
        .header(hyper::header::USER_AGENT, "kube-probe/1.33 (istio-agent)")
        .header(hyper::header::HOST, target.to_string());
    for (k, v) in headers {
        req = req.header(k.as_str(), v.as_str());
    }
    let req = req.body(Empty::<Bytes>::new()).map_err(|e| e.to_string())?;
    let resp = crate::http_client::send(io, req)
        .await
        .map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    let location = resp
        .headers()
        .get(hyper::header::LOCATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    // Read (and drop) at most MAX_BODY bytes; a larger body does not fail the probe.
    let _ = Limited::new(resp.into_body(), MAX_BODY).collect().await;
    Ok((status, location))
}

/// Where a redirect goes: `Some(path)` on the same host, `None` for another host.
fn same_host_redirect(location: &str, target: SocketAddr) -> Option<String> {
    if location.starts_with('/') {
        return Some(location.to_string());
    }
    let rest = location
        .strip_prefix("http://")
        .or_else(|| location.strip_prefix("https://"))?;
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let same = authority == target.to_string()
        || (target.port() == 80 && authority == target.ip().to_string());
    same.then(|| {
        if path.is_empty() {
            "/".to_string()
        } else {
            path.to_string()
        }
    })
}

async fn http_probe(
    target: SocketAddr,
    path: &str,
    headers: &[(String, String)],
    tls: bool,
) -> Outcome {
    let mut path = path.to_string();
    for _ in 0..=MAX_REDIRECTS {
        let (status, location) = http_once(target, &path, headers, tls).await?;
        match status {
            200..=299 => return Ok(()),
            300..=399 => match location.as_deref().map(|l| same_host_redirect(l, target)) {
                Some(Some(next)) => path = next,
                // Kubelet does not follow a redirect to another host and counts it as success.
                Some(None) => return Ok(()),
                None => return Ok(()),
            },
            _ => return Err(format!("HTTP {status} from {target}{path}")),
        }
    }
    Err(format!("more than {MAX_REDIRECTS} redirects from {target}"))
}

async fn grpc_probe(target: SocketAddr, service: &str) -> Outcome {
    let mut connector = hyper_util::client::legacy::connect::HttpConnector::new();
    connector.set_local_address(Some(source_for(target.ip())));
    connector.enforce_http(false);
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{target}"))
        .map_err(|e| e.to_string())?
        .connect_with_connector(connector)
        .await
        .map_err(|e| format!("connect {target}: {e}"))?;
    let mut client = tonic_health::pb::health_client::HealthClient::new(channel);
    let resp = client
        .check(tonic_health::pb::HealthCheckRequest {
            service: service.to_string(),
        })
        .await
        .map_err(|e| format!("gRPC health check: {}", e.message()))?;
    let serving = tonic_health::pb::health_check_response::ServingStatus::Serving as i32;
    if resp.into_inner().status == serving {
        Ok(())
    } else {
        Err("gRPC health check: not serving".to_string())
    }
}

/// Runs `probe` against `ip`.
pub async fn run(probe: &Probe, ip: IpAddr) -> Outcome {
    let work = async {
        match &probe.check {
            Check::Http {
                path,
                port,
                headers,
                tls,
            } => http_probe(SocketAddr::new(ip, *port), path, headers, *tls).await,
            Check::Tcp { port } => connect(SocketAddr::new(ip, *port))
                .await
                .map(drop)
                .map_err(|e| format!("connect {ip}:{port}: {e}")),
            Check::Grpc { port, service } => grpc_probe(SocketAddr::new(ip, *port), service).await,
        }
    };
    tokio::time::timeout(probe.timeout, work)
        .await
        .unwrap_or_else(|_| Err(format!("timed out after {:?}", probe.timeout)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redirects_stay_on_the_same_host() {
        let t: SocketAddr = "10.0.0.5:8080".parse().unwrap();
        assert_eq!(same_host_redirect("/next", t), Some("/next".into()));
        assert_eq!(
            same_host_redirect("http://10.0.0.5:8080/x", t),
            Some("/x".into())
        );
        assert_eq!(same_host_redirect("http://10.200.0.1:9/", t), None);
        assert_eq!(same_host_redirect("http://evil.example/x", t), None);
    }

    /// A 1 MiB body is read only up to MAX_BODY: the app declares 1 MiB, sends one byte more than
    /// the cap and then nothing more, holding the connection open past the probe's timeout. A probe that
    /// read the whole body would wait for the rest and time out; one that stops at the cap
    /// succeeds at once.
    #[tokio::test]
    async fn a_large_body_is_read_only_up_to_the_cap() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
        let app = tokio::spawn(async move {
            let (mut conn, peer) = listener.accept().await.unwrap();
            let mut head = Vec::new();
            let mut buf = [0u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = conn.read(&mut buf).await.unwrap();
                assert!(n > 0, "the probe closed before sending its request");
                head.extend_from_slice(&buf[..n]);
            }
            conn.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 1048576\r\n\r\n")
                .await
                .unwrap();
            conn.write_all(&vec![b'x'; MAX_BODY + 1]).await.unwrap();
            // Hold the connection (the rest of the body never comes) until the test is over.
            let _ = done_rx.await;
            peer
        });
        let probe = Probe {
            check: Check::Http {
                path: "/big".into(),
                port,
                headers: Vec::new(),
                tls: false,
            },
            timeout: std::time::Duration::from_secs(10),
        };
        let start = std::time::Instant::now();
        let outcome = run(&probe, IpAddr::V4(Ipv4Addr::LOCALHOST)).await;
        let took = start.elapsed();
        let _ = done_tx.send(());
        let peer = app.await.unwrap();
        assert_eq!(outcome, Ok(()));
        assert!(
            took < std::time::Duration::from_secs(5),
            "the probe waited {took:?} for the body beyond the cap"
        );
        assert_eq!(peer.ip(), IpAddr::V4(Ipv4Addr::new(127, 0, 0, 6)));
    }
}
