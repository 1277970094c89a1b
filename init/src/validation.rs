//! `--run-validation`: proves that redirection works before the app starts, as Istio's
//! `tools/istio-iptables/pkg/validation` does. Listeners on the capture ports accept; a client
//! connects from 127.0.0.1 to 127.0.0.6:<probe port> (::1 → ::6 for IPv6). Success means a listener
//! accepted a connection whose original destination port (`SO_ORIGINAL_DST`) is the probe port,
//! i.e. iptables redirected it. Run it as the proxy uid (as Istio's validation container does),
//! since that uid's loopback traffic is what the inbound rule captures.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use socket2::{Domain, Socket, Type};

#[derive(Debug, thiserror::Error)]
pub enum ValidationError {
    #[error("cannot listen on {addr} for validation: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error(
        "traffic to {target} was not redirected to Envoy's ports within {timeout:?}; the iptables rules \
         are missing or wrong: delete or reschedule the pod"
    )]
    NotRedirected {
        target: SocketAddr,
        timeout: Duration,
    },
}

fn listen(addr: SocketAddr) -> Result<TcpListener, ValidationError> {
    let fail = |source| ValidationError::Listen { addr, source };
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, None).map_err(fail)?;
    socket.set_reuse_address(true).map_err(fail)?;
    socket.bind(&addr.into()).map_err(fail)?;
    socket.listen(16).map_err(fail)?;
    Ok(socket.into())
}

fn original_dst_port(stream: &std::net::TcpStream, v6: bool) -> Option<u16> {
    use nix::sys::socket::{getsockopt, sockopt};
    if v6 {
        getsockopt(stream, sockopt::Ip6tOriginalDst)
            .ok()
            .map(|a| u16::from_be(a.sin6_port))
    } else {
        getsockopt(stream, sockopt::OriginalDst)
            .ok()
            .map(|a| u16::from_be(a.sin_port))
    }
}

/// Validates one family: listeners on `ports` (the outbound and inbound capture ports) at the
/// loopback address, a client probing 127.0.0.6/::6 at `probe_port`.
pub fn validate(
    v6: bool,
    ports: &[u16],
    probe_port: u16,
    timeout: Duration,
) -> Result<(), ValidationError> {
    let (local, target_ip): (IpAddr, IpAddr) = if v6 {
        (
            Ipv6Addr::LOCALHOST.into(),
            Ipv6Addr::new(0, 0, 0, 0, 0, 0, 0, 6).into(),
        )
    } else {
        (
            Ipv4Addr::LOCALHOST.into(),
            Ipv4Addr::new(127, 0, 0, 6).into(),
        )
    };
    let target = SocketAddr::new(target_ip, probe_port);
    let (tx, rx) = mpsc::channel();
    for port in ports {
        let listener = listen(SocketAddr::new(local, *port))?;
        listener.set_nonblocking(false).ok();
        let tx = tx.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                if original_dst_port(&stream, v6) == Some(probe_port) {
                    let _ = tx.send(());
                    return;
                }
            }
        });
    }
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if let Ok(socket) = Socket::new(Domain::for_address(target), Type::STREAM, None) {
            // Bind to the loopback address so the source is not the exempt 127.0.0.6.
            let _ = socket.bind(&SocketAddr::new(local, 0).into());
            let _ = socket.connect_timeout(&target.into(), Duration::from_millis(200));
        }
        if rx.recv_timeout(Duration::from_millis(200)).is_ok() {
            return Ok(());
        }
    }
    Err(ValidationError::NotRedirected { target, timeout })
}
