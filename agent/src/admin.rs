//! A minimal client for Envoy's admin API on loopback (stats for readiness, drain on shutdown).

use bytes::Bytes;
use http_body_util::{BodyExt, Full};

#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("Envoy admin on 127.0.0.1:{port} unreachable: {reason}")]
    Unreachable { port: u16, reason: String },
    #[error("Envoy admin {path} answered {status}")]
    Status { path: String, status: u16 },
}

async fn request(port: u16, method: hyper::Method, path: &str) -> Result<String, AdminError> {
    let (status, body) = exchange(port, method, path, Bytes::new()).await?;
    if status >= 400 {
        return Err(AdminError::Status {
            path: path.to_string(),
            status,
        });
    }
    Ok(body)
}

/// One HTTP/1.1 exchange with a local port: (status, body).
pub async fn exchange(
    port: u16,
    method: hyper::Method,
    path: &str,
    body: Bytes,
) -> Result<(u16, String), AdminError> {
    let unreachable = |reason: String| AdminError::Unreachable { port, reason };
    let req = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header(hyper::header::HOST, "localhost")
        .body(Full::new(body))
        .map_err(|e| unreachable(e.to_string()))?;
    let resp = crate::http_client::loopback(port, req)
        .await
        .map_err(|e| unreachable(e.reason()))?;
    let status = resp.status().as_u16();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| unreachable(e.to_string()))?
        .to_bytes();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

pub async fn get(port: u16, path: &str) -> Result<String, AdminError> {
    request(port, hyper::Method::GET, path).await
}

pub async fn post(port: u16, path: &str) -> Result<String, AdminError> {
    request(port, hyper::Method::POST, path).await
}

/// Percent-encodes a regex for a `filter=` query parameter.
pub fn encode_query(value: &str) -> String {
    let mut out = String::new();
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Parses `name: value` lines of `/stats` output into (name, value).
pub fn parse_stats(text: &str) -> Vec<(String, u64)> {
    text.lines()
        .filter_map(|l| {
            let (name, value) = l.split_once(':')?;
            Some((name.trim().to_string(), value.trim().parse().ok()?))
        })
        .collect()
}
