//! A tiny network probe for the capture tests, run inside pods.
//!   netprobe listen PORT[,PORT..]   TCP on 0.0.0.0 and [::]; prints `accept port=P orig=A local=A peer=A`
//!                                   per connection (orig from SO_ORIGINAL_DST) and answers "hi\n"
//!   netprobe udp-echo PORT          UDP on 0.0.0.0 and [::]; answers "echo PORT"
//!   netprobe connect ADDR [COUNT]   TCP connects; exit 0 if every one is accepted and answered
//!   netprobe connect-from SRC ADDR  one TCP connect from local address SRC (e.g. 127.0.0.6);
//!                                   exit 0 if it is accepted and answered
//!   netprobe udp ADDR               one datagram; prints the answer, exit 0 if one came
//!   netprobe http-echo PORT         HTTP on 0.0.0.0; answers each request with its headers
//!   netprobe line-echo PORT         TCP on 0.0.0.0, client speaks first: answers each line L
//!                                   with `echo L`
//!   netprobe say ADDR TEXT          sends the line TEXT; exit 0 if the answer is `echo TEXT`
//!   netprobe http-get ADDR HOST PATH  one HTTP/1.1 GET, no retry; prints the response, exit 0
//!                                   if its status is 200

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::time::Duration;

use socket2::{Domain, Socket, Type};

fn bind(addr: SocketAddr, ty: Type) -> std::io::Result<Socket> {
    let s = Socket::new(Domain::for_address(addr), ty, None)?;
    s.set_reuse_address(true)?;
    if addr.is_ipv6() {
        s.set_only_v6(true)?;
    }
    s.bind(&addr.into())?;
    Ok(s)
}

fn original_dst(stream: &TcpStream) -> String {
    use nix::sys::socket::{getsockopt, sockopt};
    match stream.local_addr() {
        Ok(SocketAddr::V4(_)) => getsockopt(stream, sockopt::OriginalDst)
            .map(|a| {
                let ip = std::net::Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr));
                format!("{ip}:{}", u16::from_be(a.sin_port))
            })
            .unwrap_or_else(|_| "none".to_string()),
        Ok(SocketAddr::V6(_)) => getsockopt(stream, sockopt::Ip6tOriginalDst)
            .map(|a| {
                let ip = std::net::Ipv6Addr::from(a.sin6_addr.s6_addr);
                format!("[{ip}]:{}", u16::from_be(a.sin6_port))
            })
            .unwrap_or_else(|_| "none".to_string()),
        Err(_) => "none".to_string(),
    }
}

fn listen(ports: &str) -> std::io::Result<()> {
    let mut handles = Vec::new();
    for port in ports.split(',') {
        let port: u16 = port
            .parse()
            .map_err(|_| std::io::Error::other("bad port"))?;
        for ip in ["0.0.0.0", "::"] {
            let addr = SocketAddr::new(ip.parse().map_err(std::io::Error::other)?, port);
            let s = bind(addr, Type::STREAM)?;
            s.listen(128)?;
            let listener: TcpListener = s.into();
            handles.push(std::thread::spawn(move || {
                for mut stream in listener.incoming().flatten() {
                    let peer = stream
                        .peer_addr()
                        .map(|p| p.to_string())
                        .unwrap_or_default();
                    let local = stream
                        .local_addr()
                        .map(|p| p.to_string())
                        .unwrap_or_default();
                    // orig is `none` when the connection was not NATed in this namespace.
                    println!(
                        "accept port={port} orig={} local={local} peer={peer}",
                        original_dst(&stream)
                    );
                    let _ = std::io::stdout().flush();
                    let _ = stream.write_all(b"hi\n");
                }
            }));
        }
    }
    println!("listening");
    let _ = std::io::stdout().flush();
    for h in handles {
        let _ = h.join();
    }
    Ok(())
}

fn udp_echo(port: &str) -> std::io::Result<()> {
    let port: u16 = port
        .parse()
        .map_err(|_| std::io::Error::other("bad port"))?;
    let mut handles = Vec::new();
    for ip in ["0.0.0.0", "::"] {
        let addr = SocketAddr::new(ip.parse().map_err(std::io::Error::other)?, port);
        let sock: UdpSocket = bind(addr, Type::DGRAM)?.into();
        handles.push(std::thread::spawn(move || {
            let mut buf = [0u8; 512];
            while let Ok((_, from)) = sock.recv_from(&mut buf) {
                println!("udp from={from}");
                let _ = std::io::stdout().flush();
                let _ = sock.send_to(format!("echo {port}").as_bytes(), from);
            }
        }));
    }
    println!("listening");
    let _ = std::io::stdout().flush();
    for h in handles {
        let _ = h.join();
    }
    Ok(())
}

/// One connection to `addr` (from `src` if given) that the server answers with "hi\n".
fn answered(addr: SocketAddr, src: Option<SocketAddr>) -> std::io::Result<()> {
    let mut s: TcpStream = match src {
        None => TcpStream::connect_timeout(&addr, Duration::from_secs(2))?,
        Some(src) => {
            let sock = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
            sock.bind(&src.into())?;
            sock.connect_timeout(&addr.into(), Duration::from_secs(2))?;
            sock.into()
        }
    };
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    let mut buf = [0u8; 3];
    s.read_exact(&mut buf)
}

fn connect_from(src: &str, addr: &str) -> std::io::Result<()> {
    let addr: SocketAddr = addr.parse().map_err(std::io::Error::other)?;
    let src = SocketAddr::new(src.parse().map_err(std::io::Error::other)?, 0);
    answered(addr, Some(src))
}

fn connect(addr: &str, count: usize) -> std::io::Result<()> {
    let addr: SocketAddr = addr.parse().map_err(std::io::Error::other)?;
    let mut failures = 0;
    for _ in 0..count {
        if answered(addr, None).is_err() {
            failures += 1;
        }
    }
    println!("connects={count} failures={failures}");
    if failures > 0 {
        return Err(std::io::Error::other(format!(
            "{failures} of {count} connects failed"
        )));
    }
    Ok(())
}

fn udp(addr: &str) -> std::io::Result<()> {
    let addr: SocketAddr = addr.parse().map_err(std::io::Error::other)?;
    let local = if addr.is_ipv4() {
        "0.0.0.0:0"
    } else {
        "[::]:0"
    };
    let sock = UdpSocket::bind(local)?;
    sock.set_read_timeout(Some(Duration::from_secs(2)))?;
    sock.send_to(b"q", addr)?;
    let mut buf = [0u8; 512];
    let (n, _) = sock.recv_from(&mut buf)?;
    println!("{}", String::from_utf8_lossy(&buf[..n]));
    Ok(())
}

/// HTTP/1.1 on 0.0.0.0:PORT answering every request with its own header block as the body.
fn http_echo(port: &str) -> std::io::Result<()> {
    let port: u16 = port
        .parse()
        .map_err(|_| std::io::Error::other("bad port"))?;
    let listener = TcpListener::bind(("0.0.0.0", port))?;
    for mut stream in listener.incoming().flatten() {
        std::thread::spawn(move || {
            let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
            let mut head = Vec::new();
            let mut buf = [0u8; 4096];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 65536 {
                match stream.read(&mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => head.extend_from_slice(&buf[..n]),
                }
            }
            let response = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                head.len()
            );
            let _ = stream.write_all(response.as_bytes());
            let _ = stream.write_all(&head);
        });
    }
    Ok(())
}

fn line_echo(port: &str) -> std::io::Result<()> {
    let listener = TcpListener::bind(format!("0.0.0.0:{port}"))?;
    for stream in listener.incoming().flatten() {
        std::thread::spawn(move || {
            let mut reader = std::io::BufReader::new(&stream);
            let mut line = String::new();
            while std::io::BufRead::read_line(&mut reader, &mut line).is_ok_and(|n| n > 0) {
                if (&stream)
                    .write_all(format!("echo {line}").as_bytes())
                    .is_err()
                {
                    return;
                }
                line.clear();
            }
        });
    }
    Ok(())
}

fn say(addr: &str, text: &str) -> std::io::Result<()> {
    let addr: SocketAddr = addr.parse().map_err(std::io::Error::other)?;
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.write_all(format!("{text}\n").as_bytes())?;
    let mut reader = std::io::BufReader::new(&s);
    let mut answer = String::new();
    std::io::BufRead::read_line(&mut reader, &mut answer)?;
    println!("{}", answer.trim_end());
    if answer.trim_end() == format!("echo {text}") {
        Ok(())
    } else {
        Err(std::io::Error::other(format!("answer {answer:?}")))
    }
}

fn http_get(addr: &str, host: &str, path: &str) -> std::io::Result<()> {
    let addr: SocketAddr = addr.parse().map_err(std::io::Error::other)?;
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes(),
    )?;
    let mut response = String::new();
    s.read_to_string(&mut response)?;
    println!("{response}");
    if response.starts_with("HTTP/1.1 200 ") {
        Ok(())
    } else {
        Err(std::io::Error::other("status is not 200"))
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize| args.get(i).map(String::as_str).unwrap_or_default();
    let result = match arg(0) {
        "listen" => listen(arg(1)),
        "udp-echo" => udp_echo(arg(1)),
        "connect" => connect(arg(1), arg(2).parse().unwrap_or(1)),
        "connect-from" => connect_from(arg(1), arg(2)),
        "udp" => udp(arg(1)),
        "http-echo" => http_echo(arg(1)),
        "line-echo" => line_echo(arg(1)),
        "say" => say(arg(1), arg(2)),
        "http-get" => http_get(arg(1), arg(2), arg(3)),
        _ => Err(std::io::Error::other(
            "usage: netprobe listen|udp-echo|connect|udp ...",
        )),
    };
    if let Err(e) = result {
        eprintln!("netprobe: {e}");
        std::process::exit(1);
    }
}
