//! The agent's one HTTP/1.1 client, for local ports: Envoy's admin API and its Prometheus stats,
//! the application's metrics and its probes (`pilot-agent request` and `wait` use it too).
//! One request per connection; the caller reads the body.

use hyper::body::{Body, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};

#[derive(Debug, thiserror::Error)]
pub enum HttpClientError {
    #[error("127.0.0.1:{port}: {source}")]
    Connect { port: u16, source: std::io::Error },
    #[error(transparent)]
    Http(#[from] hyper::Error),
}

impl HttpClientError {
    /// What went wrong, without the address (for callers that name it themselves).
    pub fn reason(&self) -> String {
        match self {
            HttpClientError::Connect { source, .. } => source.to_string(),
            HttpClientError::Http(e) => e.to_string(),
        }
    }
}

/// Sends `request` to `127.0.0.1:port`.
pub async fn loopback<B>(
    port: u16,
    request: Request<B>,
) -> Result<Response<Incoming>, HttpClientError>
where
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|source| HttpClientError::Connect { port, source })?;
    Ok(send(stream, request).await?)
}

/// Sends `request` over `io`, a connection the caller made (from a chosen source address, or
/// wrapped in TLS).
pub async fn send<S, B>(io: S, request: Request<B>) -> Result<Response<Incoming>, hyper::Error>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io)).await?;
    tokio::spawn(conn);
    sender.send_request(request).await
}
