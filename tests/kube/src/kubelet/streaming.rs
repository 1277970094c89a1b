//! The kubelet's server on the node (`NODE_IP:10250`, TLS with a certificate of the cluster's CA),
//! what the API server proxies `pods/exec` and `pods/log` to:
//! - `GET /containerLogs/NS/POD/CONTAINER`: the container's log (all its runs);
//! - `POST /exec/NS/POD/CONTAINER?command=..&input=1&output=1&error=1`, upgraded to SPDY/3.1 with
//!   the remote-command protocol `v4.channel.k8s.io` (what client-go's SPDY executor, kubectl's
//!   fallback and the Gateway API conformance suite speak): the client opens one stream per
//!   channel (error, stdin, stdout, stderr), the command runs in the container as
//!   [`PodRun::exec`] runs it, its output goes back on the streams, and its exit status on the
//!   error stream as a `Status`.
//!
//! - `POST /portForward/NS/POD`, upgraded to SPDY/3.1 with `portforward.k8s.io` (what the API
//!   server's `pods/portforward` leads to, for client-go's port forwarder: `kubectl
//!   port-forward`, `istioctl proxy-config` without `--file`): per connection the client opens
//!   an error and a data stream with the same `requestID` and a `port`; the data stream is
//!   joined to a TCP connection to that port on the pod's loopback, made in the pod's network
//!   namespace, and a failure to connect is written on the error stream.
//!
//! Not served: a TTY (`tty=1`), `attach`, following a log (`follow=true` returns what is
//! there).
//!
//! SPDY/3.1 framing (draft-mbelshe-httpbis-spdy-00 with the 3.1 flow-control changes): 8-byte
//! frame headers, header blocks compressed with zlib over the whole session with the protocol's
//! preset dictionary (`spdy3-dictionary.bin`). Flow control is not enforced on what this server
//! sends (client-go's spdystream does not enforce it either).

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use super::pod::PodRun;

/// The SPDY/3 header-compression dictionary (the protocol's constant, 1423 bytes).
const DICTIONARY: &[u8] = include_bytes!("../spdy3-dictionary.bin");
const SPDY_VERSION: u16 = 3;
const TYPE_SYN_STREAM: u16 = 1;
const TYPE_SYN_REPLY: u16 = 2;
const TYPE_RST_STREAM: u16 = 3;
const TYPE_PING: u16 = 6;
const TYPE_GOAWAY: u16 = 7;
const FLAG_FIN: u8 = 0x01;
/// The remote-command protocol this server speaks.
const PROTOCOL: &str = "v4.channel.k8s.io";
/// The port-forward protocol this server speaks.
const PORT_FORWARD_PROTOCOL: &str = "portforward.k8s.io";

/// Finds the running pod `namespace/name`.
pub type Lookup = Arc<dyn Fn(&str, &str) -> Option<Arc<PodRun>> + Send + Sync>;

/// The TLS configuration of the server: the certificate and key (PEM files).
pub fn tls_config(cert: &Path, key: &Path) -> Result<Arc<rustls::ServerConfig>> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs = CertificateDer::pem_file_iter(cert)
        .with_context(|| format!("read {}", cert.display()))?
        .collect::<Result<Vec<_>, _>>()?;
    let key =
        PrivateKeyDer::from_pem_file(key).with_context(|| format!("read {}", key.display()))?;
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_no_client_auth()
    .with_single_cert(certs, key)?;
    Ok(Arc::new(config))
}

/// Serves connections on `listener` until the task is aborted.
pub async fn serve(listener: TcpListener, tls: Arc<rustls::ServerConfig>, lookup: Lookup) {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            continue;
        };
        let acceptor = acceptor.clone();
        let lookup = lookup.clone();
        tokio::spawn(async move {
            if let Ok(stream) = acceptor.accept(tcp).await {
                let _ = handle(stream, lookup).await;
            }
        });
    }
}

/// One HTTP/1.1 request line and headers.
#[derive(Debug)]
struct Request {
    method: String,
    path: String,
    query: Vec<(String, String)>,
    headers: Vec<(String, String)>,
}

impl Request {
    fn header_values(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case(name))
            .flat_map(|(_, v)| v.split(','))
            .map(str::trim)
            .collect()
    }

    fn flag(&self, name: &str) -> bool {
        self.query
            .iter()
            .any(|(k, v)| k == name && (v == "1" || v == "true"))
    }
}

async fn read_request<R: AsyncRead + Unpin>(r: &mut BufReader<R>) -> Result<Request> {
    let mut head = Vec::new();
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).await? == 0 {
            bail!("connection closed in the request head");
        }
        let line = line.trim_end_matches(['\r', '\n']).to_string();
        if line.is_empty() {
            break;
        }
        head.push(line);
        if head.len() > 200 {
            bail!("request head too long");
        }
    }
    let first = head.first().context("empty request")?;
    let mut parts = first.split_whitespace();
    let method = parts.next().unwrap_or_default().to_string();
    let target = parts.next().unwrap_or_default();
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let query = query
        .split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect();
    let headers = head[1..]
        .iter()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    Ok(Request {
        method,
        path: percent_decode(path),
        query,
        headers,
    })
}

/// Decodes `%XX` escapes and `+` (a space in a query).
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => match u8::from_str_radix(&s[i + 1..i + 3], 16) {
                Ok(v) => {
                    out.push(v);
                    i += 3;
                    continue;
                }
                Err(_) => out.push(b'%'),
            },
            b'+' => out.push(b' '),
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

async fn respond<W: AsyncWrite + Unpin>(w: &mut W, status: &str, body: &[u8]) -> Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    w.write_all(head.as_bytes()).await?;
    w.write_all(body).await?;
    w.flush().await?;
    Ok(())
}

async fn handle<S: AsyncRead + AsyncWrite + Unpin + Send + 'static>(
    stream: S,
    lookup: Lookup,
) -> Result<()> {
    let mut reader = BufReader::new(stream);
    let req = read_request(&mut reader).await?;
    let segments: Vec<&str> = req.path.trim_start_matches('/').split('/').collect();
    match (req.method.as_str(), segments.as_slice()) {
        ("GET", ["containerLogs", ns, pod, container]) => {
            let run = match running(&lookup, ns, pod, container) {
                Ok(run) => run,
                Err(msg) => {
                    return respond(reader.get_mut(), "404 Not Found", msg.as_bytes()).await;
                }
            };
            let mut text = run.logs(container);
            if let Some(n) = req
                .query
                .iter()
                .find(|(k, _)| k == "tailLines")
                .and_then(|(_, v)| v.parse::<usize>().ok())
            {
                let lines: Vec<&str> = text.lines().collect();
                text = lines[lines.len().saturating_sub(n)..].join("\n");
                text.push('\n');
            }
            respond(reader.get_mut(), "200 OK", text.as_bytes()).await
        }
        ("POST" | "GET", ["portForward", ns, pod]) => {
            let (ns, pod) = (ns.to_string(), pod.to_string());
            port_forward(reader, req, lookup, &ns, &pod).await
        }
        ("POST" | "GET", ["exec", ns, pod, container]) => {
            let (ns, pod, container) = (ns.to_string(), pod.to_string(), container.to_string());
            exec(reader, req, lookup, &ns, &pod, &container).await
        }
        _ => {
            let msg = format!("{} {}: not served by this kubelet", req.method, req.path);
            respond(reader.get_mut(), "404 Not Found", msg.as_bytes()).await
        }
    }
}

/// The running pod `ns/pod` that has container `container`, or why not.
fn running(lookup: &Lookup, ns: &str, pod: &str, container: &str) -> Result<Arc<PodRun>, String> {
    let run =
        lookup(ns, pod).ok_or_else(|| format!("pod {ns}/{pod} is not running on this node"))?;
    if run.container(container).is_none() {
        return Err(format!("pod {ns}/{pod} has no container {container}"));
    }
    Ok(run)
}

/// A frame to write: bytes, already encoded.
type Frame = Vec<u8>;

fn control_frame(kind: u16, flags: u8, payload: &[u8]) -> Frame {
    let mut f = Vec::with_capacity(8 + payload.len());
    f.extend_from_slice(&(0x8000 | SPDY_VERSION).to_be_bytes());
    f.extend_from_slice(&kind.to_be_bytes());
    let len = payload.len() as u32;
    f.push(flags);
    f.extend_from_slice(&len.to_be_bytes()[1..]);
    f.extend_from_slice(payload);
    f
}

fn data_frame(stream: u32, flags: u8, payload: &[u8]) -> Frame {
    let mut f = Vec::with_capacity(8 + payload.len());
    f.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
    f.push(flags);
    f.extend_from_slice(&(payload.len() as u32).to_be_bytes()[1..]);
    f.extend_from_slice(payload);
    f
}

/// The session's header compression: one zlib context per direction for the whole session.
struct Headers {
    inflate: Decompress,
    deflate: Compress,
}

impl Headers {
    fn new() -> Headers {
        Headers {
            inflate: Decompress::new(true),
            deflate: Compress::new(Compression::default(), true),
        }
    }

    fn decode(&mut self, block: &[u8]) -> Result<Vec<(String, String)>> {
        let mut out = Vec::with_capacity(block.len() * 8 + 4096);
        let mut input = block;
        loop {
            let before = self.inflate.total_in();
            let spare = out.capacity() - out.len();
            let result = self
                .inflate
                .decompress_vec(input, &mut out, FlushDecompress::Sync);
            let used = usize::try_from(self.inflate.total_in() - before).unwrap_or(0);
            input = &input[used..];
            match result {
                Ok(_) => {}
                Err(e) if e.needs_dictionary().is_some() => {
                    self.inflate
                        .set_dictionary(DICTIONARY)
                        .context("set the SPDY header dictionary")?;
                    continue;
                }
                Err(e) => bail!("SPDY header block: {e}"),
            }
            let filled = out.capacity() - out.len() == 0 && spare > 0;
            if input.is_empty() && !filled {
                break;
            }
            out.reserve(4096);
        }
        parse_header_block(&out)
    }

    fn encode(&mut self, pairs: &[(&str, &str)]) -> Result<Vec<u8>> {
        let mut raw = Vec::new();
        raw.extend_from_slice(&(pairs.len() as u32).to_be_bytes());
        for (k, v) in pairs {
            raw.extend_from_slice(&(k.len() as u32).to_be_bytes());
            raw.extend_from_slice(k.as_bytes());
            raw.extend_from_slice(&(v.len() as u32).to_be_bytes());
            raw.extend_from_slice(v.as_bytes());
        }
        let mut out = Vec::with_capacity(raw.len() + 64);
        loop {
            let before = self.deflate.total_in();
            self.deflate
                .compress_vec(&raw, &mut out, FlushCompress::Sync)
                .context("compress SPDY headers")?;
            let used = usize::try_from(self.deflate.total_in() - before).unwrap_or(0);
            raw.drain(..used);
            if raw.is_empty() && out.len() < out.capacity() {
                break;
            }
            out.reserve(256);
        }
        Ok(out)
    }
}

fn parse_header_block(b: &[u8]) -> Result<Vec<(String, String)>> {
    let mut pos = 0usize;
    let mut next = |n: usize| -> Result<&[u8]> {
        let s = b.get(pos..pos + n).context("SPDY header block truncated")?;
        pos += n;
        Ok(s)
    };
    let be32 = |s: &[u8]| u32::from_be_bytes([s[0], s[1], s[2], s[3]]) as usize;
    let count = be32(next(4)?);
    let mut pairs = Vec::with_capacity(count.min(64));
    for _ in 0..count {
        let n = be32(next(4)?);
        let name = String::from_utf8_lossy(next(n)?).to_lowercase();
        let n = be32(next(4)?);
        let value = String::from_utf8_lossy(next(n)?).into_owned();
        pairs.push((name, value));
    }
    Ok(pairs)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Channel {
    Error,
    Stdin,
    Stdout,
    Stderr,
}

async fn exec<S: AsyncRead + AsyncWrite + Unpin + Send + 'static>(
    mut reader: BufReader<S>,
    req: Request,
    lookup: Lookup,
    ns: &str,
    pod: &str,
    container: &str,
) -> Result<()> {
    let command: Vec<String> = req
        .query
        .iter()
        .filter(|(k, _)| k == "command")
        .map(|(_, v)| v.clone())
        .collect();
    let bad_request = if command.is_empty() {
        Some("no command given".to_string())
    } else if req.flag("tty") {
        Some("tty=1: this kubelet runs no terminal".to_string())
    } else if !req
        .header_values("Upgrade")
        .iter()
        .any(|u| u.eq_ignore_ascii_case("SPDY/3.1"))
    {
        Some("exec needs an Upgrade to SPDY/3.1".to_string())
    } else if !req
        .header_values("X-Stream-Protocol-Version")
        .contains(&PROTOCOL)
    {
        Some(format!(
            "no remote-command protocol this kubelet speaks ({PROTOCOL}) was offered"
        ))
    } else {
        None
    };
    if let Some(msg) = bad_request {
        return respond(reader.get_mut(), "400 Bad Request", msg.as_bytes()).await;
    }
    let run = match running(&lookup, ns, pod, container) {
        Ok(run) => run,
        Err(msg) => return respond(reader.get_mut(), "404 Not Found", msg.as_bytes()).await,
    };
    let head = format!(
        "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: {PROTOCOL}\r\n\r\n"
    );
    reader.get_mut().write_all(head.as_bytes()).await?;
    reader.get_mut().flush().await?;

    let mut wanted = vec![Channel::Error];
    for (flag, ch) in [
        ("input", Channel::Stdin),
        ("output", Channel::Stdout),
        ("error", Channel::Stderr),
    ] {
        if req.flag(flag) {
            wanted.push(ch);
        }
    }
    let (rd, wr) = tokio::io::split(reader);
    let (tx, writer) = frame_writer(wr);
    let session = Session {
        rd,
        tx: tx.clone(),
        headers: Headers::new(),
        streams: HashMap::new(),
    };
    let result = session
        .run(&wanted, run, container.to_string(), command)
        .await;
    drop(tx);
    let _ = writer.await;
    result
}

struct Session<R> {
    rd: R,
    tx: mpsc::UnboundedSender<Frame>,
    headers: Headers,
    streams: HashMap<Channel, u32>,
}

/// What the client sent that the session acts on.
enum Incoming {
    /// Data on the stdin stream, and whether it was the last.
    Stdin(Vec<u8>, bool),
    /// A stream was opened.
    Opened,
}

impl<R: AsyncRead + Unpin + Send + 'static> Session<R> {
    async fn read_frame(&mut self) -> Result<Option<([u8; 8], Vec<u8>)>> {
        read_frame(&mut self.rd).await
    }

    /// Reads frames, answering control frames, until one the session acts on (`None`: the
    /// client is gone).
    async fn next(&mut self) -> Result<Option<Incoming>> {
        loop {
            let Some((h, payload)) = self.read_frame().await? else {
                return Ok(None);
            };
            if h[0] & 0x80 == 0 {
                let stream = u32::from_be_bytes([h[0], h[1], h[2], h[3]]) & 0x7fff_ffff;
                if self.streams.get(&Channel::Stdin) == Some(&stream) {
                    return Ok(Some(Incoming::Stdin(payload, h[4] & FLAG_FIN != 0)));
                }
                continue;
            }
            let kind = u16::from_be_bytes([h[2], h[3]]);
            match kind {
                TYPE_SYN_STREAM => {
                    if payload.len() < 10 {
                        bail!("SYN_STREAM too short");
                    }
                    let id = u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]])
                        & 0x7fff_ffff;
                    let pairs = self.headers.decode(&payload[10..])?;
                    let kind = pairs
                        .iter()
                        .find(|(k, _)| k == "streamtype")
                        .map(|(_, v)| v.as_str());
                    let channel = match kind {
                        Some("error") => Channel::Error,
                        Some("stdin") => Channel::Stdin,
                        Some("stdout") => Channel::Stdout,
                        Some("stderr") => Channel::Stderr,
                        _ => {
                            // A stream this protocol has no use for (resize): refused.
                            let mut p = id.to_be_bytes().to_vec();
                            p.extend_from_slice(&3u32.to_be_bytes()); // REFUSED_STREAM
                            let _ = self.tx.send(control_frame(TYPE_RST_STREAM, 0, &p));
                            continue;
                        }
                    };
                    self.streams.insert(channel, id);
                    let block = self.headers.encode(&[])?;
                    let mut p = id.to_be_bytes().to_vec();
                    p.extend_from_slice(&block);
                    let _ = self.tx.send(control_frame(TYPE_SYN_REPLY, 0, &p));
                    return Ok(Some(Incoming::Opened));
                }
                TYPE_PING => {
                    let _ = self.tx.send(control_frame(TYPE_PING, 0, &payload));
                }
                TYPE_GOAWAY => return Ok(None),
                // SETTINGS, WINDOW_UPDATE, RST_STREAM, HEADERS: nothing to do.
                _ => {}
            }
        }
    }

    async fn run(
        mut self,
        wanted: &[Channel],
        run: Arc<PodRun>,
        container: String,
        command: Vec<String>,
    ) -> Result<()> {
        // The client opens every channel it asked for before it sends anything.
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
        while !wanted.iter().all(|c| self.streams.contains_key(c)) {
            match tokio::time::timeout_at(deadline, self.next()).await {
                Ok(Ok(Some(_))) => {}
                Ok(Ok(None)) => return Ok(()),
                Ok(Err(e)) => return Err(e),
                Err(_) => bail!("the client did not open its streams in 30 s"),
            }
        }
        let argv: Vec<&str> = command.iter().map(String::as_str).collect();
        let mut cmd = tokio::process::Command::from(run.command(&container, &argv)?);
        let has = |c: Channel| self.streams.contains_key(&c);
        cmd.stdin(if has(Channel::Stdin) {
            std::process::Stdio::piped()
        } else {
            std::process::Stdio::null()
        })
        .stdout(if has(Channel::Stdout) {
            std::process::Stdio::piped()
        } else {
            std::process::Stdio::null()
        })
        .stderr(if has(Channel::Stderr) {
            std::process::Stdio::piped()
        } else {
            std::process::Stdio::null()
        })
        .kill_on_drop(true);
        let error_stream = self.streams[&Channel::Error];
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                let status = serde_json::json!({"metadata": {}, "status": "Failure",
                    "message": format!("start {}: {e}", command[0]), "reason": "InternalError"});
                let _ = self.tx.send(data_frame(
                    error_stream,
                    FLAG_FIN,
                    status.to_string().as_bytes(),
                ));
                return Ok(());
            }
        };
        let mut pumps = Vec::new();
        for (ch, out) in [
            (
                Channel::Stdout,
                child
                    .stdout
                    .take()
                    .map(|o| Box::new(o) as Box<dyn AsyncRead + Unpin + Send>),
            ),
            (
                Channel::Stderr,
                child
                    .stderr
                    .take()
                    .map(|o| Box::new(o) as Box<dyn AsyncRead + Unpin + Send>),
            ),
        ] {
            let (Some(mut out), Some(&id)) = (out, self.streams.get(&ch)) else {
                continue;
            };
            let tx = self.tx.clone();
            pumps.push(tokio::spawn(async move { pump(&mut out, id, &tx).await }));
        }
        let mut stdin = child.stdin.take();
        let code = loop {
            tokio::select! {
                status = child.wait() => break status?.code().unwrap_or(128),
                incoming = self.next() => match incoming {
                    Ok(Some(Incoming::Stdin(data, fin))) => {
                        if let Some(s) = stdin.as_mut() && !data.is_empty() {
                            let _ = s.write_all(&data).await;
                        }
                        if fin {
                            stdin = None;
                        }
                    }
                    Ok(Some(Incoming::Opened)) => {}
                    // The client went away: the command is killed (kill_on_drop).
                    Ok(None) | Err(_) => return Ok(()),
                },
            }
        };
        for p in pumps {
            let _ = p.await;
        }
        let status = if code == 0 {
            serde_json::json!({"metadata": {}, "status": "Success"})
        } else {
            serde_json::json!({"metadata": {}, "status": "Failure",
                "message": format!("command terminated with non-zero exit code: exit status {code}"),
                "reason": "NonZeroExitCode",
                "details": {"causes": [{"reason": "ExitCode", "message": code.to_string()}]}})
        };
        let _ = self.tx.send(data_frame(
            error_stream,
            FLAG_FIN,
            status.to_string().as_bytes(),
        ));
        // Wait for the client to close (it reads the error stream, then hangs up).
        let _ = tokio::time::timeout(std::time::Duration::from_secs(10), async {
            while let Ok(Some(_)) = self.next().await {}
        })
        .await;
        Ok(())
    }
}

/// Reads one SPDY frame: its 8-byte header and payload (`None` at the end of the connection).
async fn read_frame<R: AsyncRead + Unpin>(rd: &mut R) -> Result<Option<([u8; 8], Vec<u8>)>> {
    let mut h = [0u8; 8];
    match rd.read_exact(&mut h).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let len = u32::from_be_bytes([0, h[5], h[6], h[7]]) as usize;
    let mut payload = vec![0u8; len];
    rd.read_exact(&mut payload).await?;
    Ok(Some((h, payload)))
}

/// The session's writer: frames sent on the channel are written in order; the connection is
/// shut down once every sender is gone.
fn frame_writer<W: AsyncWrite + Unpin + Send + 'static>(
    mut wr: W,
) -> (mpsc::UnboundedSender<Frame>, tokio::task::JoinHandle<()>) {
    let (tx, mut rx) = mpsc::unbounded_channel::<Frame>();
    let writer = tokio::spawn(async move {
        while let Some(f) = rx.recv().await {
            if wr.write_all(&f).await.is_err() {
                break;
            }
            let _ = wr.flush().await;
        }
        let _ = wr.shutdown().await;
    });
    (tx, writer)
}

/// Sends what `out` gives as data frames of `stream`, then ends the stream (FIN).
async fn pump<R: AsyncRead + Unpin>(out: &mut R, stream: u32, tx: &mpsc::UnboundedSender<Frame>) {
    let mut buf = vec![0u8; 32 * 1024];
    loop {
        match out.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let _ = tx.send(data_frame(stream, 0, &buf[..n]));
            }
        }
    }
    let _ = tx.send(data_frame(stream, FLAG_FIN, &[]));
}

/// A TCP connection to `port` on the loopback of network namespace `netns`, made from a thread
/// of its own that enters the namespace and ends (a socket stays in the namespace it was made
/// in; no thread of the runtime changes namespace).
async fn connect_in(netns: &str, port: u16) -> Result<tokio::net::TcpStream> {
    let path = format!("/run/netns/{netns}");
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let made = (|| -> Result<std::net::TcpStream> {
            let file = std::fs::File::open(&path).with_context(|| path.clone())?;
            nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
                .with_context(|| format!("enter {path}"))?;
            let stream = std::net::TcpStream::connect_timeout(
                &std::net::SocketAddr::from(([127, 0, 0, 1], port)),
                std::time::Duration::from_secs(5),
            )
            .with_context(|| format!("connect to 127.0.0.1:{port}"))?;
            stream.set_nonblocking(true)?;
            Ok(stream)
        })();
        let _ = tx.send(made);
    });
    let stream = rx.await.context("the connecting thread ended")??;
    Ok(tokio::net::TcpStream::from_std(stream)?)
}

async fn port_forward<S: AsyncRead + AsyncWrite + Unpin + Send + 'static>(
    mut reader: BufReader<S>,
    req: Request,
    lookup: Lookup,
    ns: &str,
    pod: &str,
) -> Result<()> {
    if !req
        .header_values("Upgrade")
        .iter()
        .any(|u| u.eq_ignore_ascii_case("SPDY/3.1"))
        || !req
            .header_values("X-Stream-Protocol-Version")
            .contains(&PORT_FORWARD_PROTOCOL)
    {
        let msg = format!("port-forward needs an Upgrade to SPDY/3.1 with {PORT_FORWARD_PROTOCOL}");
        return respond(reader.get_mut(), "400 Bad Request", msg.as_bytes()).await;
    }
    let Some(run) = lookup(ns, pod) else {
        let msg = format!("pod {ns}/{pod} is not running on this node");
        return respond(reader.get_mut(), "404 Not Found", msg.as_bytes()).await;
    };
    let head = format!(
        "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: {PORT_FORWARD_PROTOCOL}\r\n\r\n"
    );
    reader.get_mut().write_all(head.as_bytes()).await?;
    reader.get_mut().flush().await?;
    let (mut rd, wr) = tokio::io::split(reader);
    let (tx, writer) = frame_writer(wr);
    let mut headers = Headers::new();
    // Per request id: its error stream, and its data stream once open.
    let mut error_streams: HashMap<String, u32> = HashMap::new();
    // Per data stream id: where the client's bytes go.
    let mut sinks: HashMap<u32, tokio::net::tcp::OwnedWriteHalf> = HashMap::new();
    while let Some((h, payload)) = read_frame(&mut rd).await? {
        if h[0] & 0x80 == 0 {
            let stream = u32::from_be_bytes([h[0], h[1], h[2], h[3]]) & 0x7fff_ffff;
            if let Some(sink) = sinks.get_mut(&stream) {
                if !payload.is_empty() && sink.write_all(&payload).await.is_err() {
                    sinks.remove(&stream);
                } else if h[4] & FLAG_FIN != 0 {
                    let _ = sink.shutdown().await;
                    sinks.remove(&stream);
                }
            }
            continue;
        }
        match u16::from_be_bytes([h[2], h[3]]) {
            TYPE_SYN_STREAM => {
                if payload.len() < 10 {
                    bail!("SYN_STREAM too short");
                }
                let id = u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]])
                    & 0x7fff_ffff;
                let pairs = headers.decode(&payload[10..])?;
                let get = |k: &str| {
                    pairs
                        .iter()
                        .find(|(n, _)| n == k)
                        .map(|(_, v)| v.clone())
                        .unwrap_or_default()
                };
                let (kind, request, port) = (get("streamtype"), get("requestid"), get("port"));
                let block = headers.encode(&[])?;
                let mut reply = id.to_be_bytes().to_vec();
                reply.extend_from_slice(&block);
                let _ = tx.send(control_frame(TYPE_SYN_REPLY, 0, &reply));
                match kind.as_str() {
                    "error" => {
                        error_streams.insert(request, id);
                    }
                    "data" => {
                        let error_stream = error_streams.get(&request).copied();
                        let connected = match port.parse::<u16>() {
                            Ok(p) => connect_in(&run.netns, p).await,
                            Err(_) => Err(anyhow::anyhow!("invalid port {port:?}")),
                        };
                        match connected {
                            Ok(conn) => {
                                let (mut from_pod, to_pod) = conn.into_split();
                                sinks.insert(id, to_pod);
                                let tx = tx.clone();
                                tokio::spawn(async move {
                                    pump(&mut from_pod, id, &tx).await;
                                    if let Some(e) = error_stream {
                                        let _ = tx.send(data_frame(e, FLAG_FIN, &[]));
                                    }
                                });
                            }
                            Err(e) => {
                                let msg = format!(
                                    "error forwarding port {port} to pod {ns}/{pod}: {e:#}"
                                );
                                if let Some(e) = error_stream {
                                    let _ = tx.send(data_frame(e, FLAG_FIN, msg.as_bytes()));
                                }
                                let _ = tx.send(data_frame(id, FLAG_FIN, &[]));
                            }
                        }
                    }
                    _ => {
                        let mut p = id.to_be_bytes().to_vec();
                        p.extend_from_slice(&3u32.to_be_bytes()); // REFUSED_STREAM
                        let _ = tx.send(control_frame(TYPE_RST_STREAM, 0, &p));
                    }
                }
            }
            TYPE_PING => {
                let _ = tx.send(control_frame(TYPE_PING, 0, &payload));
            }
            TYPE_GOAWAY => break,
            _ => {}
        }
    }
    drop(tx);
    let _ = writer.await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_decode() {
        assert_eq!(percent_decode("http%3A%2F%2Fecho%2Fa+b"), "http://echo/a b");
        assert_eq!(percent_decode("100%"), "100%");
        assert_eq!(percent_decode("%zz"), "%zz");
    }

    #[test]
    fn headers_round_trip_through_the_session_contexts() {
        // What a peer compresses (with the dictionary, as client-go does) this side reads.
        let mut peer = Compress::new_with_window_bits(Compression::default(), true, 15);
        peer.set_dictionary(DICTIONARY).unwrap();
        let mut ours = Headers::new();
        for stream in ["error", "stdout", "stderr"] {
            let mut raw = Vec::new();
            raw.extend_from_slice(&1u32.to_be_bytes());
            for s in ["streamType", stream] {
                raw.extend_from_slice(&(s.len() as u32).to_be_bytes());
                raw.extend_from_slice(s.as_bytes());
            }
            let mut block = Vec::with_capacity(256);
            peer.compress_vec(&raw, &mut block, FlushCompress::Sync)
                .unwrap();
            let pairs = ours.decode(&block).unwrap();
            assert_eq!(pairs, [("streamtype".to_string(), stream.to_string())]);
        }
        // What this side compresses, a plain zlib reader reads (no dictionary needed).
        let a = ours.encode(&[("a", "1")]).unwrap();
        let b = ours.encode(&[]).unwrap();
        let mut inflate = Decompress::new(true);
        let mut out = Vec::with_capacity(1024);
        inflate
            .decompress_vec(&[a, b].concat(), &mut out, FlushDecompress::Sync)
            .unwrap();
        assert_eq!(
            out,
            [
                &1u32.to_be_bytes()[..],
                &1u32.to_be_bytes(),
                b"a",
                &1u32.to_be_bytes(),
                b"1",
                &0u32.to_be_bytes()
            ]
            .concat()
        );
    }
}
