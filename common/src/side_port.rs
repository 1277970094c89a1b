//! The one HTTP/1 server for side ports (the agent's 15020, istiod-core's debug port), with the
//! limits a port reachable from the pod network needs: a deadline for the request head (a client
//! that sends headers slowly, or never, is cut off, and so is an idle keep-alive connection), a cap
//! on the head's size (431 beyond it), a cap on a request's body (413 beyond it; a body of unknown
//! length, chunked, gets 411: no side-port endpoint takes a streamed upload), and connection
//! slots per peer and in total, with loopback kept apart ([`crate::conn_slots`]): a new
//! connection takes the place of the oldest one that has not sent a whole request, so probes are
//! answered however many half-open connections a peer holds. Accept errors (out of file
//! descriptors) back off instead of spinning. Serves until `shutdown` resolves.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{Either, Full};
use hyper::body::{Body, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;

use crate::conn_slots::{SlotLimits, Slots};

/// Limits of a side-port server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Time a client has to send the whole request head.
    pub header_read_timeout: Duration,
    /// Largest request head (and read buffer), in bytes.
    pub max_head_bytes: usize,
    /// Largest request body, in bytes, as its Content-Length declares it.
    pub max_body_bytes: u64,
    /// Connections held at once, per peer and in total (see [`crate::conn_slots`]).
    pub connections: SlotLimits,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            header_read_timeout: Duration::from_secs(3),
            max_head_bytes: 64 * 1024,
            max_body_bytes: 64 * 1024,
            connections: SlotLimits {
                total: 256,
                per_peer: 32,
                loopback: 64,
            },
        }
    }
}

/// The answer to a request whose body is over the limit or of unknown length; the connection is
/// closed after it, as the body is left unread.
fn refuse_body(req: &Request<Incoming>, max: u64) -> Option<Response<Full<Bytes>>> {
    let (status, why) = match req.body().size_hint().exact() {
        Some(len) if len > max => (
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("request body of {len} bytes is over the {max}-byte limit\n"),
        ),
        Some(_) => return None,
        None => (
            StatusCode::LENGTH_REQUIRED,
            "a request body must declare its Content-Length\n".to_string(),
        ),
    };
    let mut resp = Response::new(Full::new(Bytes::from(why)));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        hyper::header::CONNECTION,
        hyper::header::HeaderValue::from_static("close"),
    );
    Some(resp)
}

/// Serves `handler` (peer address, request → response) on `listener` within `limits`; `what`
/// names the port in log lines.
pub async fn serve<H, F, B>(
    what: &'static str,
    listener: TcpListener,
    limits: Limits,
    handler: H,
    shutdown: impl Future<Output = ()>,
) where
    H: Fn(SocketAddr, Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<B>> + Send + 'static,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let slots = Slots::new(what, limits.connections);
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, port = what, "side port: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = &mut shutdown => return,
        };
        // Refused (every connection busy): the stream is dropped, closing it.
        let Some(slot) = slots.admit(peer) else {
            continue;
        };
        let slot = Arc::new(slot);
        let handler = handler.clone();
        tokio::spawn(async move {
            let in_service = slot.clone();
            let svc = hyper::service::service_fn(move |req| {
                let (handler, slot) = (handler.clone(), in_service.clone());
                slot.busy();
                async move {
                    let resp = match refuse_body(&req, limits.max_body_bytes) {
                        Some(refused) => refused.map(Either::Right),
                        None => handler(peer, req).await.map(Either::Left),
                    };
                    slot.unfinished();
                    Ok::<_, Infallible>(resp)
                }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_read_timeout)
                .max_header_size(limits.max_head_bytes)
                .max_buf_size(limits.max_head_bytes.max(8192))
                .serve_connection(TokioIo::new(stream), svc);
            tokio::select! {
                ended = conn => if let Err(e) = ended {
                    tracing::debug!(error = %e, %peer, "side port connection ended");
                },
                () = slot.evicted() => tracing::debug!(%peer, "side port connection closed for a newer one"),
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn server(limits: Limits) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(serve(
            "test",
            listener,
            limits,
            |_, _| async { Response::new(http_body_util::Full::new(bytes::Bytes::from("ok"))) },
            std::future::pending(),
        ));
        addr
    }

    #[tokio::test]
    async fn a_slow_head_is_cut_off_and_others_are_served() {
        let addr = server(Limits {
            header_read_timeout: Duration::from_millis(300),
            ..Limits::default()
        })
        .await;
        let mut slow = tokio::net::TcpStream::connect(addr).await.unwrap();
        slow.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n")
            .await
            .unwrap();
        let mut buf = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(5), slow.read_to_end(&mut buf)).await;
        assert!(
            read.is_ok(),
            "a connection that never finished its head was kept open"
        );
        let mut ok = tokio::net::TcpStream::connect(addr).await.unwrap();
        ok.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut text = String::new();
        ok.read_to_string(&mut text).await.unwrap();
        assert!(
            text.starts_with("HTTP/1.1 200") && text.ends_with("ok"),
            "{text}"
        );
    }

    /// Reads until the server closes; `None` if it keeps the connection open past 5 s.
    async fn closed(s: &mut tokio::net::TcpStream) -> Option<Vec<u8>> {
        let mut buf = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut buf))
            .await
            .ok()
            .map(|_| buf)
    }

    #[tokio::test]
    async fn a_new_connection_takes_the_place_of_the_oldest_half_open_one() {
        let limits = Limits {
            connections: SlotLimits {
                total: 2,
                per_peer: 2,
                loopback: 2,
            },
            ..Limits::default()
        };
        let addr = server(limits).await;
        let mut oldest = tokio::net::TcpStream::connect(addr).await.unwrap();
        oldest.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut second = tokio::net::TcpStream::connect(addr).await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let text = exchange(
            addr,
            b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
        .await;
        assert!(
            text.starts_with("HTTP/1.1 200"),
            "the probe was not served: {text}"
        );
        assert_eq!(
            closed(&mut oldest).await.as_deref(),
            Some(&b""[..]),
            "the oldest half-open connection was kept"
        );
        // The second one is still open: the probe needed one place only.
        let mut buf = [0u8; 1];
        let still = tokio::time::timeout(Duration::from_millis(200), second.read(&mut buf)).await;
        assert!(still.is_err(), "the second connection was closed too");
    }

    /// Sends `request` on a new connection and reads the answer until the server closes.
    async fn exchange(addr: SocketAddr, request: &[u8]) -> String {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let _ = s.write_all(request).await;
        let mut text = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut text)).await;
        String::from_utf8_lossy(&text).into_owned()
    }

    #[tokio::test]
    async fn an_oversized_head_is_refused_with_431() {
        let addr = server(Limits {
            max_head_bytes: 8192,
            ..Limits::default()
        })
        .await;
        // Just over the limit, so that the server has read all of it when it answers.
        let big = format!(
            "GET / HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
            "a".repeat(8192)
        );
        let text = exchange(addr, big.as_bytes()).await;
        assert!(text.starts_with("HTTP/1.1 431"), "{text}");
    }

    #[tokio::test]
    async fn a_body_over_the_limit_or_of_unknown_length_is_refused() {
        let addr = server(Limits {
            max_body_bytes: 1024,
            ..Limits::default()
        })
        .await;
        let text = exchange(
            addr,
            b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1048576\r\n\r\n",
        )
        .await;
        assert!(text.starts_with("HTTP/1.1 413"), "{text}");
        assert!(
            text.contains("1048576 bytes is over the 1024-byte limit"),
            "{text}"
        );
        let text = exchange(
            addr,
            b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n",
        )
        .await;
        assert!(text.starts_with("HTTP/1.1 411"), "{text}");
        // Within the limit, the handler answers.
        let text = exchange(
            addr,
            b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello",
        )
        .await;
        assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    }

    /// A connection that sends nothing, or nothing more after a request, is closed after the
    /// head deadline: idle connections do not hold the connection slots.
    #[tokio::test]
    async fn idle_connections_are_closed() {
        let addr = server(Limits {
            header_read_timeout: Duration::from_millis(300),
            ..Limits::default()
        })
        .await;
        let mut silent = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut buf = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(5), silent.read_to_end(&mut buf)).await;
        assert!(read.is_ok(), "a silent connection was kept open");
        let mut kept = tokio::net::TcpStream::connect(addr).await.unwrap();
        kept.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut buf = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(5), kept.read_to_end(&mut buf)).await;
        assert!(read.is_ok(), "an idle keep-alive connection was kept open");
        assert!(String::from_utf8_lossy(&buf).starts_with("HTTP/1.1 200"));
    }
}
