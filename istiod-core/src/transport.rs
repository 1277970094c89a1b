//! The xDS port's connections, bounded before any authentication: slots per peer and in total
//! ([`mesh_common::conn_slots`], loopback apart), a deadline for a new connection to finish its
//! TLS handshake and HTTP/2 preface and send its first request, and file descriptors kept back
//! for the config reload and the CA's files. A connection that has sent a request is busy and is
//! never pushed out for a newer one; one that has not is, oldest first, and is closed at its
//! deadline. HTTP/2 keepalive and the streams' send timeout are set where the server is built
//! (`serve`) and where a stream sends (`xds_server`), which closes its connection through
//! [`Slots::close`].

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use mesh_common::conn_slots::{Slot, SlotLimits, Slots};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tonic::transport::server::{Connected, TcpConnectInfo, TlsConnectInfo};

/// File descriptors kept for everything but connections: the config directory's reload, the
/// CA's files, the debug port, logs.
pub const FD_HEADROOM: u64 = 256;

/// The bounds of the xDS port's connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransportLimits {
    pub slots: SlotLimits,
    /// Time a new connection has to finish its handshakes and send a request.
    pub handshake_timeout: Duration,
}

/// Raises the soft limit of open files to the hard limit (as Go programs, istiod among them, do
/// at start) and returns what is left for connections after [`FD_HEADROOM`].
pub fn fds_for_connections() -> u64 {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return 1024_u64.saturating_sub(FD_HEADROOM);
    };
    let soft = if hard > soft && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() {
        hard
    } else {
        soft
    };
    soft.saturating_sub(FD_HEADROOM)
}

/// `limits` with the total connections clamped to the file descriptors there are for them;
/// said in the log when clamped.
pub fn within_fds(mut limits: TransportLimits, fds: u64) -> TransportLimits {
    let room = usize::try_from(fds).unwrap_or(usize::MAX).max(1);
    let both = limits.slots.total.saturating_add(limits.slots.loopback);
    if both > room {
        tracing::warn!(
            asked = limits.slots.total,
            loopback = limits.slots.loopback,
            fds,
            headroom = FD_HEADROOM,
            "--max-connections and the loopback connections are more than the open-file limit \
             leaves; lowered to fit, so that the config reload always has descriptors"
        );
        limits.slots.loopback = limits.slots.loopback.min(room / 4).max(1);
        limits.slots.total = (room - limits.slots.loopback.min(room)).max(1);
        limits.slots.per_peer = limits.slots.per_peer.min(limits.slots.total);
    }
    limits
}

/// The listener's connections as tonic's incoming stream: admitted or closed at once, each
/// guarded by its deadline and eviction. Accept errors (out of descriptors) back off.
pub fn incoming(
    listener: TcpListener,
    slots: Arc<Slots>,
    handshake_timeout: Duration,
) -> impl Stream<Item = io::Result<Guarded>> + Send + 'static {
    futures::stream::unfold((listener, slots), move |(listener, slots)| async move {
        loop {
            let (stream, peer) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(e) => {
                    tracing::warn!(error = %e, "xDS port: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let Some(slot) = slots.admit(peer) else {
                continue;
            };
            // As Go (istiod) sets on every connection: without it a response's last small
            // write waits for the proxy's delayed ACK (40 ms on Linux).
            let _ = stream.set_nodelay(true);
            let guarded = Guarded::new(stream, slot, handshake_timeout);
            return Some((Ok(guarded), (listener, slots)));
        }
    })
}

/// One admitted connection: its reads and writes fail once it is evicted or closed, or when its
/// deadline passes before it sent a request.
pub struct Guarded {
    io: TcpStream,
    slot: Slot,
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    closed: Pin<Box<dyn Future<Output = ()> + Send>>,
}

impl Guarded {
    fn new(io: TcpStream, slot: Slot, handshake_timeout: Duration) -> Guarded {
        let closed = Box::pin(slot.evicted_owned());
        Guarded {
            io,
            slot,
            deadline: Some(Box::pin(tokio::time::sleep(handshake_timeout))),
            closed,
        }
    }

    /// The error that ends the connection, if it is to end.
    fn ended(&mut self, cx: &mut Context<'_>) -> Option<io::Error> {
        if self.closed.as_mut().poll(cx).is_ready() {
            return Some(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "closed for a newer connection, or for not reading its stream",
            ));
        }
        if let Some(deadline) = self.deadline.as_mut()
            && deadline.as_mut().poll(cx).is_ready()
        {
            if !self.slot.is_busy() {
                tracing::debug!(
                    peer = ?self.io.peer_addr().ok(),
                    "xDS connection sent no request before its deadline; closed"
                );
                return Some(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "no request before the handshake deadline",
                ));
            }
            self.deadline = None;
        }
        None
    }
}

impl AsyncRead for Guarded {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if let Some(e) = self.ended(cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Guarded {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if let Some(e) = self.ended(cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if let Some(e) = self.ended(cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

impl Connected for Guarded {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.io.connect_info()
    }
}

/// The peer address of a request on the xDS port, plaintext or TLS.
pub fn remote_addr<B>(req: &http::Request<B>) -> Option<SocketAddr> {
    let ext = req.extensions();
    ext.get::<TcpConnectInfo>()
        .and_then(TcpConnectInfo::remote_addr)
        .or_else(|| {
            ext.get::<TlsConnectInfo<TcpConnectInfo>>()
                .and_then(|tls| tls.get_ref().remote_addr())
        })
}

/// A layer that marks a connection busy on its first request (and every later one).
#[derive(Clone)]
pub struct MarkBusy(pub Arc<Slots>);

impl<S> tower::Layer<S> for MarkBusy {
    type Service = MarkBusyService<S>;

    fn layer(&self, inner: S) -> MarkBusyService<S> {
        MarkBusyService {
            inner,
            slots: self.0.clone(),
        }
    }
}

#[derive(Clone)]
pub struct MarkBusyService<S> {
    inner: S,
    slots: Arc<Slots>,
}

impl<S, B> tower::Service<http::Request<B>> for MarkBusyService<S>
where
    S: tower::Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> S::Future {
        if let Some(addr) = remote_addr(&req) {
            self.slots.busy(addr);
        }
        self.inner.call(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(total: usize, loopback: usize) -> TransportLimits {
        TransportLimits {
            slots: SlotLimits {
                total,
                per_peer: 100,
                loopback,
            },
            handshake_timeout: Duration::from_secs(10),
        }
    }

    #[test]
    fn connections_are_clamped_to_the_descriptors_left() {
        assert_eq!(within_fds(limits(1000, 100), 100_000), limits(1000, 100));
        let got = within_fds(limits(100_000, 1024), 768);
        assert_eq!(got.slots.loopback, 192);
        assert_eq!(got.slots.total, 576);
        assert_eq!(got.slots.per_peer, 100);
    }
}
