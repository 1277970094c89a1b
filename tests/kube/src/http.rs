//! One HTTP/1.1 GET as the kubelet's prober sends it, for the probes and the tests' checks from
//! the node.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// An HTTP/1.1 GET as the kubelet's prober sends it; returns the status code.
pub async fn http_probe(
    host: &str,
    port: u16,
    path: &str,
    headers: &[(String, String)],
    timeout: Duration,
) -> Result<u16> {
    Ok(http_get(host, port, path, headers, timeout).await?.0)
}

/// One plain HTTP GET from the node; the body of a 200 answer.
pub async fn http_get_text(host: &str, port: u16, path: &str) -> Result<String> {
    match http_get(host, port, path, &[], Duration::from_secs(10)).await? {
        (200, body) => Ok(body),
        (code, _) => bail!("GET {host}:{port}{path}: {code}"),
    }
}

/// One HTTP/1.1 GET (`Connection: close`, the kubelet's User-Agent and Accept unless `headers`
/// give them) within `timeout`: the status code and the body.
async fn http_get(
    host: &str,
    port: u16,
    path: &str,
    headers: &[(String, String)],
    timeout: Duration,
) -> Result<(u16, String)> {
    let fut = async {
        let mut s = tokio::net::TcpStream::connect((host, port)).await?;
        let mut req = format!("GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\n");
        let has = |n: &str| headers.iter().any(|(k, _)| k.eq_ignore_ascii_case(n));
        if !has("user-agent") {
            req.push_str("User-Agent: kube-probe/1.36\r\n");
        }
        if !has("accept") {
            req.push_str("Accept: */*\r\n");
        }
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str("Connection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await?;
        let mut out = Vec::new();
        s.read_to_end(&mut out).await?;
        let text = String::from_utf8_lossy(&out).to_string();
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let code: u16 = head
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .with_context(|| format!("GET {host}:{port}{path}: not an HTTP response"))?;
        let body = if head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked")
        {
            dechunk(body)
        } else {
            body.to_string()
        };
        anyhow::Ok((code, body))
    };
    tokio::time::timeout(timeout, fut)
        .await
        .with_context(|| format!("GET {host}:{port}{path} timed out"))?
}

fn dechunk(body: &str) -> String {
    let mut out = String::new();
    let mut rest = body;
    while let Some((size, after)) = rest.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || after.len() < n {
            break;
        }
        out.push_str(&after[..n]);
        rest = after[n..].trim_start_matches("\r\n");
    }
    out
}
