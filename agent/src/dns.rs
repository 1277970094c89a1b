//! The DNS proxy on `localhost:15053` (UDP and TCP), as Istio's `pkg/dns/client/dns.go`: A/AAAA
//! for mesh names are answered authoritatively from the name table the control plane pushes over
//! NDS (TTL 30 s, addresses shuffled); a known name without records of the asked family gets
//! NOERROR with no answer (not NXDOMAIN); everything else is forwarded to the resolv.conf servers.
//! Before the first table arrives every query gets SERVFAIL. Wire format: hickory-proto.
//!
//! Bounds (`Limits`): a packet that is not a DNS query with a question is dropped, never
//! forwarded; forwarded queries in flight are capped (beyond, SERVFAIL at once); a reply to a
//! forwarded query is taken only from the server it was sent to (a connected socket) and only
//! with the query's id and question, anything else is dropped; TCP connections are capped and
//! closed when idle.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use hickory_proto::op::{Message, MessageType, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA};
use hickory_proto::rr::{Name, RData, Record, RecordType};
use istio_proto::nds::NameTable;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;

const TTL: u32 = 30;
const UDP_MAX: usize = 512;

/// Answers for one name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Entry {
    v4: Vec<Ipv4Addr>,
    v6: Vec<Ipv6Addr>,
    /// For `<host>.<first search domain>`: answered as a CNAME to the host, then its addresses.
    cname: Option<String>,
}

/// The names the proxy answers, keyed by lowercase FQDN with a trailing dot.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DnsTable {
    names: HashMap<String, Entry>,
    /// The NDS version it came from (what a NACK names as the last accepted).
    pub version: String,
}

impl DnsTable {
    /// Builds the table from NDS: each hostname, and for Kubernetes services the forms a pod can
    /// use: `name.namespace`, `name.namespace.svc`, and `name` within its own namespace.
    pub fn from_name_table(
        table: &NameTable,
        pod_namespace: &str,
        search: Option<&str>,
    ) -> DnsTable {
        let mut names = HashMap::new();
        for (host, info) in &table.table {
            let mut entry = Entry::default();
            for ip in info.ips.iter().filter_map(|i| i.parse::<IpAddr>().ok()) {
                match ip {
                    IpAddr::V4(v4) => entry.v4.push(v4),
                    IpAddr::V6(v6) => entry.v6.push(v6),
                }
            }
            let mut aliases = vec![host.clone()];
            if info.registry == "Kubernetes" && !info.shortname.is_empty() {
                aliases.push(format!("{}.{}", info.shortname, info.namespace));
                aliases.push(format!("{}.{}.svc", info.shortname, info.namespace));
                if info.namespace == pod_namespace {
                    aliases.push(info.shortname.clone());
                }
            }
            // A resolver with search domains tries `<host>.<first search domain>` first; answer it
            // with a CNAME to the host at once instead of a round trip upstream (as Istio does).
            if let Some(search) = search.filter(|s| !s.is_empty()) {
                let canonical = format!("{}.", host.to_ascii_lowercase());
                names.insert(
                    format!(
                        "{}.{}.",
                        host.to_ascii_lowercase(),
                        search.trim_end_matches('.')
                    ),
                    Entry {
                        cname: Some(canonical),
                        ..entry.clone()
                    },
                );
            }
            for alias in aliases {
                names.insert(format!("{}.", alias.to_ascii_lowercase()), entry.clone());
            }
        }
        DnsTable {
            names,
            version: String::new(),
        }
    }

    /// The table as JSON (name → addresses), for `/debug/ndsz`.
    pub fn to_json(&self) -> serde_json::Value {
        let mut names: Vec<_> = self.names.iter().collect();
        names.sort_by(|a, b| a.0.cmp(b.0));
        serde_json::Value::Object(
            names
                .into_iter()
                .map(|(name, e)| {
                    let ips: Vec<String> =
                        e.v4.iter()
                            .map(ToString::to_string)
                            .chain(e.v6.iter().map(ToString::to_string))
                            .collect();
                    (
                        name.clone(),
                        serde_json::json!({ "ips": ips, "cname": e.cname }),
                    )
                })
                .collect(),
        )
    }

    pub fn len(&self) -> usize {
        self.names.len()
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }
}

/// The table as published by the xDS proxy; `None` until the first NDS push.
pub type TableWatch = watch::Receiver<Option<Arc<DnsTable>>>;

fn shuffled<T: Clone>(items: &[T]) -> Vec<T> {
    let mut v = items.to_vec();
    if v.len() > 1 {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos() as usize)
            .unwrap_or_default();
        let n = v.len();
        v.rotate_left(seed % n);
    }
    v
}

/// What to do with a packet.
enum Decision {
    Reply(Vec<u8>),
    /// Ask the upstream resolvers; the parsed query checks their replies.
    Forward(Message),
    /// Not a DNS query with a question: answered by nothing, forwarded nowhere.
    Drop,
}

/// The DNS proxy's bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Queries forwarded upstream at once, UDP and TCP together; more get SERVFAIL at once.
    pub max_forwards: usize,
    /// TCP connections held at once; a new one takes the place of the oldest that is not
    /// waiting for an answer, and is closed only when all are (see `mesh_common::conn_slots`).
    pub max_tcp_connections: usize,
    /// A TCP connection that sends no complete query for this long is closed.
    pub tcp_idle_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_forwards: 256,
            max_tcp_connections: 128,
            tcp_idle_timeout: Duration::from_secs(10),
        }
    }
}

fn reply(
    query: &Message,
    code: ResponseCode,
    authoritative: bool,
    answers: Vec<Record>,
) -> Message {
    let mut resp = Message::new(
        query.metadata.id,
        MessageType::Response,
        query.metadata.op_code,
    );
    resp.metadata.recursion_desired = query.metadata.recursion_desired;
    resp.metadata.recursion_available = true;
    resp.metadata.authoritative = authoritative;
    resp.metadata.response_code = code;
    resp.queries = query.queries.clone();
    resp.answers = answers;
    resp
}

fn encode(mut resp: Message, max: usize) -> Vec<u8> {
    let bytes = resp.to_vec().unwrap_or_default();
    if bytes.len() <= max {
        return bytes;
    }
    resp.answers.clear();
    resp.metadata.truncation = true;
    resp.to_vec().unwrap_or_default()
}

fn decide(packet: &[u8], table: Option<&DnsTable>, max: usize) -> Decision {
    let Ok(query) = Message::from_vec(packet) else {
        return Decision::Drop;
    };
    if query.metadata.message_type != MessageType::Query {
        return Decision::Drop;
    }
    let Some(q) = query.queries.first() else {
        return Decision::Drop;
    };
    let Some(table) = table else {
        return Decision::Reply(encode(
            reply(&query, ResponseCode::ServFail, false, vec![]),
            max,
        ));
    };
    let qtype = q.query_type();
    if !matches!(qtype, RecordType::A | RecordType::AAAA) {
        return Decision::Forward(query);
    }
    let name = q.name().to_ascii().to_ascii_lowercase();
    let name = if name.ends_with('.') {
        name
    } else {
        format!("{name}.")
    };
    let Some(entry) = table.names.get(&name) else {
        return Decision::Forward(query);
    };
    let mut owner: Name = q.name().clone();
    let mut answers: Vec<Record> = Vec::new();
    if let Some(target) = entry
        .cname
        .as_deref()
        .and_then(|c| Name::from_ascii(c).ok())
    {
        answers.push(Record::from_rdata(
            owner.clone(),
            TTL,
            RData::CNAME(hickory_proto::rr::rdata::CNAME(target.clone())),
        ));
        owner = target;
    }
    match qtype {
        RecordType::A => answers.extend(
            shuffled(&entry.v4)
                .into_iter()
                .map(|ip| Record::from_rdata(owner.clone(), TTL, RData::A(A(ip)))),
        ),
        _ => answers.extend(
            shuffled(&entry.v6)
                .into_iter()
                .map(|ip| Record::from_rdata(owner.clone(), TTL, RData::AAAA(AAAA(ip)))),
        ),
    }
    let max = query
        .edns
        .as_ref()
        .map_or(max, |e| usize::from(e.max_payload()).max(max));
    Decision::Reply(encode(
        reply(&query, ResponseCode::NoError, true, answers),
        max,
    ))
}

/// The reply the proxy sends itself for `packet` (a query in DNS wire format), given the name
/// table (`None` before the first NDS push) and the largest reply size; `None` when it does not
/// answer the query itself (it goes to the upstream resolvers). The server's own decision,
/// public for the fuzz target (`fuzz/fuzz_targets/dns_query.rs`).
pub fn local_reply(packet: &[u8], table: Option<&DnsTable>, max: usize) -> Option<Vec<u8>> {
    match decide(packet, table, max) {
        Decision::Reply(bytes) => Some(bytes),
        _ => None,
    }
}

/// Upstream resolvers and how to use them.
#[derive(Debug, Clone)]
pub struct Upstreams {
    pub servers: Vec<SocketAddr>,
    pub timeout: Duration,
    /// DNS_FORWARD_PARALLEL: ask all servers at once and take the first answer.
    pub parallel: bool,
}

/// Whether `reply` answers `query`: a response with its id and its question (or, for an error,
/// none: a server that cannot parse a question may leave it out).
fn answers(query: &Message, reply: &[u8]) -> bool {
    let Ok(reply) = Message::from_vec(reply) else {
        return false;
    };
    reply.metadata.message_type == MessageType::Response
        && reply.metadata.id == query.metadata.id
        && (reply.queries == query.queries
            || (reply.queries.is_empty() && reply.metadata.response_code != ResponseCode::NoError))
}

async fn ask(
    packet: &[u8],
    query: &Message,
    server: SocketAddr,
    timeout: Duration,
) -> Option<Vec<u8>> {
    let bind: SocketAddr = if server.is_ipv4() {
        (Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let sock = tokio::net::UdpSocket::bind(bind).await.ok()?;
    // Connected: the kernel delivers only datagrams from `server` (and reports a closed port
    // at once instead of after the timeout).
    sock.connect(server).await.ok()?;
    sock.send(packet).await.ok()?;
    let deadline = tokio::time::Instant::now() + timeout;
    let mut buf = vec![0u8; 65535];
    loop {
        let n = tokio::time::timeout_at(deadline, sock.recv(&mut buf))
            .await
            .ok()?
            .ok()?;
        let reply = buf.get(..n)?;
        if answers(query, reply) {
            return Some(reply.to_vec());
        }
        tracing::debug!(%server, "dropped a DNS reply that does not answer the forwarded query");
    }
}

async fn forward_udp(packet: &[u8], query: &Message, up: &Upstreams) -> Option<Vec<u8>> {
    if up.parallel && up.servers.len() > 1 {
        let asks = up
            .servers
            .iter()
            .map(|s| Box::pin(ask(packet, query, *s, up.timeout)));
        let mut pending: Vec<_> = asks.collect();
        while !pending.is_empty() {
            let (answer, _, rest) = futures::future::select_all(pending).await;
            if answer.is_some() {
                return answer;
            }
            pending = rest;
        }
        return None;
    }
    for server in &up.servers {
        if let Some(answer) = ask(packet, query, *server, up.timeout).await {
            return Some(answer);
        }
    }
    None
}

fn servfail(query: &Message) -> Vec<u8> {
    encode(reply(query, ResponseCode::ServFail, false, vec![]), UDP_MAX)
}

/// Forwards `query` when a forwarding slot is free; SERVFAIL when none is or no server answers.
async fn forward(
    packet: &[u8],
    query: &Message,
    up: &Upstreams,
    forwards: &tokio::sync::Semaphore,
) -> Vec<u8> {
    let Ok(_slot) = forwards.try_acquire() else {
        tracing::debug!("DNS forwarding limit reached; SERVFAIL");
        return servfail(query);
    };
    forward_udp(packet, query, up)
        .await
        .unwrap_or_else(|| servfail(query))
}

/// The answer to a packet; `None` for one that is dropped.
async fn answer(
    packet: &[u8],
    table: &TableWatch,
    up: &Upstreams,
    forwards: &tokio::sync::Semaphore,
    max: usize,
) -> Option<Vec<u8>> {
    let current = table.borrow().clone();
    match decide(packet, current.as_deref(), max) {
        Decision::Reply(bytes) => Some(bytes),
        Decision::Forward(query) => Some(forward(packet, &query, up, forwards).await),
        Decision::Drop => None,
    }
}

/// Starts the DNS proxy for `cfg` under `tasks`. Returns the table's sender (the xDS proxy fills
/// it from NDS) and a receiver of it (readiness waits for the first table).
pub fn start(
    cfg: &crate::config::DnsConfig,
    metrics: Arc<crate::metrics::Metrics>,
    tasks: &mut mesh_common::tasks::Supervisor,
) -> (watch::Sender<Option<Arc<DnsTable>>>, TableWatch) {
    let (table_tx, table_rx) = watch::channel(None);
    let upstreams = Upstreams {
        servers: cfg.upstreams.clone(),
        timeout: cfg.forward_timeout,
        parallel: cfg.forward_parallel,
    };
    tasks.spawn(
        "dns",
        serve(
            cfg.listen,
            table_rx.clone(),
            upstreams,
            Limits::default(),
            metrics,
        ),
    );
    (table_tx, table_rx)
}

/// Binds UDP and TCP on `addr` (TCP on the port UDP got, when `addr`'s port is 0: if that TCP
/// port is taken, another pair is tried, a few times).
pub async fn bind(
    addr: SocketAddr,
) -> std::io::Result<(tokio::net::UdpSocket, tokio::net::TcpListener)> {
    let mut tries = 0;
    loop {
        let udp = tokio::net::UdpSocket::bind(addr).await?;
        match tokio::net::TcpListener::bind(udp.local_addr()?).await {
            Ok(tcp) => return Ok((udp, tcp)),
            Err(e) if addr.port() == 0 && tries < 8 => {
                tracing::debug!(error = %e, "TCP port of the UDP one taken; another pair");
                tries += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Serves UDP and TCP on `addr` until the process ends.
pub async fn serve(
    addr: SocketAddr,
    table: TableWatch,
    up: Upstreams,
    limits: Limits,
    metrics: Arc<crate::metrics::Metrics>,
) -> std::io::Result<()> {
    let (udp, tcp) = bind(addr).await?;
    tracing::info!(%addr, upstreams = ?up.servers, "DNS proxy listening");
    serve_on(udp, tcp, table, up, limits, metrics).await
}

/// One TCP connection: length-prefixed queries, answered in turn, until the client closes, idles
/// past the limit, or sends a packet that is not a query.
async fn serve_tcp(
    mut stream: tokio::net::TcpStream,
    slot: &mesh_common::conn_slots::Slot,
    table: TableWatch,
    up: Upstreams,
    forwards: Arc<tokio::sync::Semaphore>,
    limits: Limits,
    metrics: Arc<crate::metrics::Metrics>,
) {
    loop {
        let read = async {
            let len = stream.read_u16().await?;
            let mut buf = vec![0u8; usize::from(len)];
            stream.read_exact(&mut buf).await?;
            Ok::<_, std::io::Error>(buf)
        };
        let Ok(Ok(query)) = tokio::time::timeout(limits.tcp_idle_timeout, read).await else {
            return;
        };
        slot.busy();
        metrics.dns_requests.inc();
        let Some(resp) = answer(&query, &table, &up, &forwards, usize::from(u16::MAX)).await else {
            tracing::debug!("dropped a DNS packet that is not a query; closing its connection");
            return;
        };
        let Ok(n) = u16::try_from(resp.len()) else {
            return;
        };
        let write = async {
            stream.write_u16(n).await?;
            stream.write_all(&resp).await
        };
        if !matches!(
            tokio::time::timeout(limits.tcp_idle_timeout, write).await,
            Ok(Ok(()))
        ) {
            return;
        }
        slot.unfinished();
    }
}

/// Serves UDP and TCP on bound sockets until the process ends.
pub async fn serve_on(
    udp: tokio::net::UdpSocket,
    tcp: tokio::net::TcpListener,
    table: TableWatch,
    up: Upstreams,
    limits: Limits,
    metrics: Arc<crate::metrics::Metrics>,
) -> std::io::Result<()> {
    let udp = Arc::new(udp);
    let forwards = Arc::new(tokio::sync::Semaphore::new(limits.max_forwards));
    let (t2, u2, m2, f2) = (table.clone(), up.clone(), metrics.clone(), forwards.clone());
    tokio::spawn(async move {
        let n = limits.max_tcp_connections;
        let connections = mesh_common::conn_slots::Slots::new(
            "DNS proxy (TCP)",
            mesh_common::conn_slots::SlotLimits {
                total: n,
                per_peer: n,
                loopback: n,
            },
        );
        loop {
            let (stream, peer) = match tcp.accept().await {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of descriptors, typically: back off rather than spin.
                    tracing::warn!(error = %e, "DNS proxy: TCP accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            // Every connection waiting for an answer: this one is closed (dropped).
            let Some(slot) = connections.admit(peer) else {
                continue;
            };
            let (table, up, metrics, forwards) = (t2.clone(), u2.clone(), m2.clone(), f2.clone());
            tokio::spawn(async move {
                tokio::select! {
                    () = serve_tcp(stream, &slot, table, up, forwards, limits, metrics) => {}
                    () = slot.evicted() => {}
                }
            });
        }
    });
    let mut buf = vec![0u8; 4096];
    loop {
        let (n, from) = udp.recv_from(&mut buf).await?;
        metrics.dns_requests.inc();
        let packet = buf.get(..n).unwrap_or_default();
        // Table hits (the common case) are answered in place; only forwarding gets a task.
        let current = table.borrow().clone();
        match decide(packet, current.as_deref(), UDP_MAX) {
            Decision::Reply(resp) => {
                let _ = udp.send_to(&resp, from).await;
            }
            Decision::Drop => {
                tracing::debug!(%from, "dropped a DNS packet that is not a query");
            }
            Decision::Forward(query) => {
                let Ok(slot) = forwards.clone().try_acquire_owned() else {
                    tracing::debug!("DNS forwarding limit reached; SERVFAIL");
                    let _ = udp.send_to(&servfail(&query), from).await;
                    continue;
                };
                let packet = packet.to_vec();
                let (udp, up) = (udp.clone(), up.clone());
                tokio::spawn(async move {
                    let resp = forward_udp(&packet, &query, &up)
                        .await
                        .unwrap_or_else(|| servfail(&query));
                    drop(slot);
                    let _ = udp.send_to(&resp, from).await;
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::op::{OpCode, Query};
    use istio_proto::nds::name_table::NameInfo;

    fn table() -> DnsTable {
        let mut t = NameTable::default();
        t.table.insert(
            "httpbin.demo.svc.cluster.local".into(),
            NameInfo {
                ips: vec!["10.96.0.10".into()],
                registry: "Kubernetes".into(),
                shortname: "httpbin".into(),
                namespace: "demo".into(),
                alt_hosts: vec![],
            },
        );
        DnsTable::from_name_table(&t, "demo", Some("demo.svc.cluster.local"))
    }

    fn query(name: &str, t: RecordType) -> Vec<u8> {
        let mut m = Message::new(7, MessageType::Query, OpCode::Query);
        m.metadata.recursion_desired = true;
        m.add_query(Query::query(Name::from_ascii(name).unwrap(), t));
        m.to_vec().unwrap()
    }

    fn reply_of(d: Decision) -> Message {
        match d {
            Decision::Reply(b) => Message::from_vec(&b).unwrap(),
            Decision::Forward(_) => panic!("forwarded"),
            Decision::Drop => panic!("dropped"),
        }
    }

    #[test]
    fn answers_mesh_names_in_their_short_forms() {
        let t = table();
        for name in [
            "httpbin.demo.svc.cluster.local.",
            "httpbin.",
            "httpbin.demo.",
            "HTTPBIN.demo.svc.",
        ] {
            let r = reply_of(decide(&query(name, RecordType::A), Some(&t), UDP_MAX));
            assert_eq!(r.metadata.response_code, ResponseCode::NoError, "{name}");
            assert!(r.metadata.authoritative);
            assert_eq!(r.answers.len(), 1, "{name}");
            assert_eq!(r.answers[0].ttl, TTL);
            assert_eq!(r.metadata.id, 7);
        }
        // The first search domain appended by a resolver: CNAME to the host, then its address.
        let r = reply_of(decide(
            &query(
                "httpbin.demo.svc.cluster.local.demo.svc.cluster.local.",
                RecordType::A,
            ),
            Some(&t),
            UDP_MAX,
        ));
        assert_eq!(r.answers.len(), 2);
        assert_eq!(r.answers[0].record_type(), RecordType::CNAME);
        assert_eq!(
            r.answers[1].name.to_ascii(),
            "httpbin.demo.svc.cluster.local."
        );
        // Known name, no IPv6 address: NOERROR with no answer.
        let r = reply_of(decide(
            &query("httpbin.", RecordType::AAAA),
            Some(&t),
            UDP_MAX,
        ));
        assert_eq!(r.metadata.response_code, ResponseCode::NoError);
        assert!(r.answers.is_empty());
        // Unknown names and other types go upstream.
        assert!(matches!(
            decide(&query("example.com.", RecordType::A), Some(&t), UDP_MAX),
            Decision::Forward(_)
        ));
        assert!(matches!(
            decide(&query("httpbin.", RecordType::MX), Some(&t), UDP_MAX),
            Decision::Forward(_)
        ));
        // Before the first table: SERVFAIL.
        let r = reply_of(decide(&query("httpbin.", RecordType::A), None, UDP_MAX));
        assert_eq!(r.metadata.response_code, ResponseCode::ServFail);
    }

    fn query_id(id: u16, name: &str) -> Vec<u8> {
        let mut m = Message::from_vec(&query(name, RecordType::A)).unwrap();
        m.metadata.id = id;
        m.to_vec().unwrap()
    }

    /// A reply to `query` (its id and question unless overridden) with one A record.
    fn reply_with(query: &[u8], id: Option<u16>, name: Option<&str>, ip: [u8; 4]) -> Vec<u8> {
        let q = Message::from_vec(query).unwrap();
        let mut r = reply(&q, ResponseCode::NoError, false, vec![]);
        if let Some(id) = id {
            r.metadata.id = id;
        }
        if let Some(name) = name {
            r.queries = vec![Query::query(Name::from_ascii(name).unwrap(), RecordType::A)];
        }
        let owner = r.queries[0].name().clone();
        r.answers = vec![Record::from_rdata(owner, 5, RData::A(A(ip.into())))];
        r.to_vec().unwrap()
    }

    const WAIT: Duration = Duration::from_secs(10);

    /// A proxy on loopback with the mesh table, forwarding to `servers`.
    async fn proxy(servers: Vec<SocketAddr>, timeout: Duration, limits: Limits) -> SocketAddr {
        let (udp, tcp) = bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
            .await
            .unwrap();
        let addr = udp.local_addr().unwrap();
        let (_tx, rx) = watch::channel(Some(Arc::new(table())));
        let up = Upstreams {
            servers,
            timeout,
            parallel: false,
        };
        let metrics = Arc::new(crate::metrics::Metrics::new());
        tokio::spawn(serve_on(udp, tcp, rx, up, limits, metrics));
        addr
    }

    async fn udp_client(proxy: SocketAddr) -> tokio::net::UdpSocket {
        let c = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        c.connect(proxy).await.unwrap();
        c
    }

    async fn recv(sock: &tokio::net::UdpSocket) -> (Vec<u8>, SocketAddr) {
        let mut buf = vec![0u8; 65535];
        let (n, from) = tokio::time::timeout(WAIT, sock.recv_from(&mut buf))
            .await
            .expect("a datagram within the bound")
            .unwrap();
        buf.truncate(n);
        (buf, from)
    }

    fn first_a(reply: &[u8]) -> (u16, ResponseCode, Option<Ipv4Addr>) {
        let m = Message::from_vec(reply).unwrap();
        let ip = m.answers.iter().find_map(|r| match &r.data {
            RData::A(a) => Some(a.0),
            _ => None,
        });
        (m.metadata.id, m.metadata.response_code, ip)
    }

    /// Bytes that are not a query (not DNS, a response, no question) are dropped: the upstream
    /// server's first packet is the valid query sent after them, and so is the client's first
    /// reply.
    #[tokio::test]
    async fn packets_that_are_not_queries_are_dropped_not_forwarded() {
        let upstream = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = proxy(
            vec![upstream.local_addr().unwrap()],
            WAIT,
            Limits::default(),
        )
        .await;
        let client = udp_client(addr).await;
        let valid = query_id(9, "example.com.");
        let mut response = Message::from_vec(&valid).unwrap();
        response.metadata.message_type = MessageType::Response;
        let mut no_question = Message::from_vec(&valid).unwrap();
        no_question.queries.clear();
        for garbage in [
            b"\x00\x01not dns at all".to_vec(),
            response.to_vec().unwrap(),
            no_question.to_vec().unwrap(),
        ] {
            client.send(&garbage).await.unwrap();
        }
        client.send(&valid).await.unwrap();
        let (forwarded, from) = recv(&upstream).await;
        assert_eq!(forwarded, valid, "the upstream got something else first");
        upstream
            .send_to(&reply_with(&valid, None, None, [1, 2, 3, 4]), from)
            .await
            .unwrap();
        let (reply, _) = recv(&client).await;
        assert_eq!(
            first_a(&reply),
            (9, ResponseCode::NoError, Some(Ipv4Addr::new(1, 2, 3, 4)))
        );
    }

    /// Only the server the query went to, with the query's id and question, is listened to:
    /// a forged reply from elsewhere, and replies with another id or question, are dropped.
    #[tokio::test]
    async fn replies_that_do_not_answer_the_forwarded_query_are_dropped() {
        let upstream = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let spoofer = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = proxy(
            vec![upstream.local_addr().unwrap()],
            WAIT,
            Limits::default(),
        )
        .await;
        let client = udp_client(addr).await;
        let q = query_id(7, "example.com.");
        client.send(&q).await.unwrap();
        let (_, from) = recv(&upstream).await;
        for (sock, id, name, ip) in [
            (&spoofer, None, None, [6, 6, 6, 6]),
            (&upstream, Some(8), None, [6, 6, 6, 7]),
            (&upstream, None, Some("other.example."), [6, 6, 6, 8]),
        ] {
            sock.send_to(&reply_with(&q, id, name, ip), from)
                .await
                .unwrap();
        }
        upstream.send_to(b"garbage", from).await.unwrap();
        upstream
            .send_to(&reply_with(&q, None, None, [1, 2, 3, 4]), from)
            .await
            .unwrap();
        let (reply, _) = recv(&client).await;
        assert_eq!(
            first_a(&reply),
            (7, ResponseCode::NoError, Some(Ipv4Addr::new(1, 2, 3, 4)))
        );
    }

    /// With `max_forwards` queries waiting on the upstream, the next gets SERVFAIL at once,
    /// unforwarded; once one is answered, forwarding resumes.
    #[tokio::test]
    async fn forwarded_queries_in_flight_are_capped() {
        let upstream = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = proxy(
            vec![upstream.local_addr().unwrap()],
            Duration::from_secs(120),
            Limits {
                max_forwards: 2,
                ..Limits::default()
            },
        )
        .await;
        let client = udp_client(addr).await;
        let mut pending = Vec::new();
        for id in [1, 2] {
            client.send(&query_id(id, "example.com.")).await.unwrap();
            pending.push(recv(&upstream).await);
        }
        client.send(&query_id(3, "example.com.")).await.unwrap();
        let (reply, _) = recv(&client).await;
        assert_eq!(first_a(&reply), (3, ResponseCode::ServFail, None));
        let (q1, from1) = &pending[0];
        upstream
            .send_to(&reply_with(q1, None, None, [1, 1, 1, 1]), *from1)
            .await
            .unwrap();
        let (reply, _) = recv(&client).await;
        assert_eq!(first_a(&reply).0, 1);
        client.send(&query_id(4, "example.com.")).await.unwrap();
        let (q4, _) = recv(&upstream).await;
        assert_eq!(Message::from_vec(&q4).unwrap().metadata.id, 4);
    }

    async fn tcp_ask(stream: &mut tokio::net::TcpStream, packet: &[u8]) -> Vec<u8> {
        stream
            .write_u16(u16::try_from(packet.len()).unwrap())
            .await
            .unwrap();
        stream.write_all(packet).await.unwrap();
        let len = tokio::time::timeout(WAIT, stream.read_u16())
            .await
            .unwrap()
            .unwrap();
        let mut buf = vec![0u8; usize::from(len)];
        stream.read_exact(&mut buf).await.unwrap();
        buf
    }

    /// Reads until the server closes; panics if it does not within the bound.
    async fn closed(stream: &mut tokio::net::TcpStream) {
        let mut rest = Vec::new();
        let read = tokio::time::timeout(WAIT, stream.read_to_end(&mut rest)).await;
        assert!(read.is_ok(), "the connection was left open");
    }

    /// TCP: connections beyond the cap are closed; one that idles, or sends half a query, is
    /// closed after the idle timeout; one that sends a packet that is not a query is closed and
    /// nothing is forwarded.
    #[tokio::test]
    async fn tcp_connections_are_capped_idle_ones_closed_and_garbage_not_forwarded() {
        let upstream = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = proxy(
            vec![upstream.local_addr().unwrap()],
            WAIT,
            Limits {
                max_tcp_connections: 2,
                tcp_idle_timeout: Duration::from_secs(120),
                ..Limits::default()
            },
        )
        .await;
        let mut held = Vec::new();
        for _ in 0..2 {
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            let r = tcp_ask(&mut s, &query_id(5, "httpbin.")).await;
            assert_eq!(first_a(&r).1, ResponseCode::NoError);
            held.push(s);
        }
        // A third connection takes the place of the oldest idle one.
        let mut third = tokio::net::TcpStream::connect(addr).await.unwrap();
        let r = tcp_ask(&mut third, &query_id(6, "httpbin.")).await;
        assert_eq!(first_a(&r).1, ResponseCode::NoError);
        closed(&mut held[0]).await;
        drop(third);
        // Garbage closes its connection, freeing its slot; nothing reaches the upstream.
        let mut garbage = held.pop().unwrap();
        garbage.write_u16(4).await.unwrap();
        garbage.write_all(b"junk").await.unwrap();
        closed(&mut garbage).await;
        let valid = query_id(11, "example.com.");
        let mut s = loop {
            // The slot is freed once the server has seen the garbage: retry within the bound.
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            if s.write_u16(u16::try_from(valid.len()).unwrap())
                .await
                .is_ok()
                && s.write_all(&valid).await.is_ok()
            {
                let mut b = [0u8; 1];
                match tokio::time::timeout(Duration::from_millis(200), s.peek(&mut b)).await {
                    Ok(Ok(0)) => continue,
                    _ => break s,
                }
            }
        };
        let (forwarded, from) = recv(&upstream).await;
        assert_eq!(forwarded, valid, "the upstream got something else first");
        upstream
            .send_to(&reply_with(&valid, None, None, [1, 2, 3, 4]), from)
            .await
            .unwrap();
        let len = tokio::time::timeout(WAIT, s.read_u16())
            .await
            .unwrap()
            .unwrap();
        let mut reply = vec![0u8; usize::from(len)];
        s.read_exact(&mut reply).await.unwrap();
        assert_eq!(first_a(&reply).0, 11);

        let addr = proxy(
            vec![],
            WAIT,
            Limits {
                tcp_idle_timeout: Duration::from_millis(300),
                ..Limits::default()
            },
        )
        .await;
        let mut silent = tokio::net::TcpStream::connect(addr).await.unwrap();
        closed(&mut silent).await;
        let mut half = tokio::net::TcpStream::connect(addr).await.unwrap();
        half.write_all(&[0, 40, 1, 2]).await.unwrap();
        closed(&mut half).await;
    }
}
