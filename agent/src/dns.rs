//! The DNS proxy on `localhost:15053` (UDP and TCP), as Istio's `pkg/dns/client/dns.go`: A/AAAA
//! for mesh names are answered authoritatively from the name table the control plane pushes over
//! NDS (TTL 30 s, addresses shuffled); a known name without records of the asked family gets
//! NOERROR with no answer (not NXDOMAIN); everything else is forwarded to the resolv.conf servers.
//! Before the first table arrives every query gets SERVFAIL. Wire format: hickory-proto.

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
        DnsTable { names }
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

/// What to do with a query.
enum Decision {
    Reply(Vec<u8>),
    Forward,
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
        return Decision::Forward;
    };
    let Some(q) = query.queries.first() else {
        return Decision::Forward;
    };
    let Some(table) = table else {
        return Decision::Reply(encode(
            reply(&query, ResponseCode::ServFail, false, vec![]),
            max,
        ));
    };
    let qtype = q.query_type();
    if !matches!(qtype, RecordType::A | RecordType::AAAA) {
        return Decision::Forward;
    }
    let name = q.name().to_ascii().to_ascii_lowercase();
    let name = if name.ends_with('.') {
        name
    } else {
        format!("{name}.")
    };
    let Some(entry) = table.names.get(&name) else {
        return Decision::Forward;
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

async fn ask(packet: &[u8], server: SocketAddr, timeout: Duration) -> Option<Vec<u8>> {
    let bind: SocketAddr = if server.is_ipv4() {
        (Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let sock = tokio::net::UdpSocket::bind(bind).await.ok()?;
    sock.send_to(packet, server).await.ok()?;
    let mut buf = vec![0u8; 65535];
    let (n, _) = tokio::time::timeout(timeout, sock.recv_from(&mut buf))
        .await
        .ok()?
        .ok()?;
    buf.truncate(n);
    Some(buf)
}

async fn forward_udp(packet: &[u8], up: &Upstreams) -> Option<Vec<u8>> {
    if up.parallel && up.servers.len() > 1 {
        let asks = up
            .servers
            .iter()
            .map(|s| Box::pin(ask(packet, *s, up.timeout)));
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
        if let Some(answer) = ask(packet, *server, up.timeout).await {
            return Some(answer);
        }
    }
    None
}

fn servfail(packet: &[u8]) -> Vec<u8> {
    Message::from_vec(packet)
        .map(|q| encode(reply(&q, ResponseCode::ServFail, false, vec![]), UDP_MAX))
        .unwrap_or_default()
}

async fn answer(packet: &[u8], table: &TableWatch, up: &Upstreams, max: usize) -> Vec<u8> {
    let current = table.borrow().clone();
    match decide(packet, current.as_deref(), max) {
        Decision::Reply(bytes) => bytes,
        Decision::Forward => match forward_udp(packet, up).await {
            Some(bytes) => bytes,
            None => servfail(packet),
        },
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
        serve(cfg.listen, table_rx.clone(), upstreams, metrics),
    );
    (table_tx, table_rx)
}

/// Serves UDP and TCP on `addr` until the process ends.
pub async fn serve(
    addr: SocketAddr,
    table: TableWatch,
    up: Upstreams,
    metrics: Arc<crate::metrics::Metrics>,
) -> std::io::Result<()> {
    let udp = Arc::new(tokio::net::UdpSocket::bind(addr).await?);
    let tcp = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(%addr, upstreams = ?up.servers, "DNS proxy listening");
    let (t2, u2, m2) = (table.clone(), up.clone(), metrics.clone());
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = tcp.accept().await else {
                continue;
            };
            let (table, up, metrics) = (t2.clone(), u2.clone(), m2.clone());
            tokio::spawn(async move {
                let mut stream = stream;
                loop {
                    let Ok(len) = stream.read_u16().await else {
                        return;
                    };
                    metrics.dns_requests.inc();
                    let mut buf = vec![0u8; usize::from(len)];
                    if stream.read_exact(&mut buf).await.is_err() {
                        return;
                    }
                    let resp = answer(&buf, &table, &up, usize::from(u16::MAX)).await;
                    let Ok(n) = u16::try_from(resp.len()) else {
                        return;
                    };
                    if stream.write_u16(n).await.is_err() || stream.write_all(&resp).await.is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    let mut buf = vec![0u8; 4096];
    loop {
        let (n, from) = udp.recv_from(&mut buf).await?;
        metrics.dns_requests.inc();
        // Table hits (the common case) are answered in place; only forwarding gets a task.
        let current = table.borrow().clone();
        match decide(&buf[..n], current.as_deref(), UDP_MAX) {
            Decision::Reply(resp) => {
                let _ = udp.send_to(&resp, from).await;
            }
            Decision::Forward => {
                let packet = buf[..n].to_vec();
                let (udp, up) = (udp.clone(), up.clone());
                tokio::spawn(async move {
                    let resp = forward_udp(&packet, &up)
                        .await
                        .unwrap_or_else(|| servfail(&packet));
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
            Decision::Forward => panic!("forwarded"),
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
            Decision::Forward
        ));
        assert!(matches!(
            decide(&query("httpbin.", RecordType::MX), Some(&t), UDP_MAX),
            Decision::Forward
        ));
        // Before the first table: SERVFAIL.
        let r = reply_of(decide(&query("httpbin.", RecordType::A), None, UDP_MAX));
        assert_eq!(r.metadata.response_code, ResponseCode::ServFail);
    }
}
