//! A load client for `istiod-core serve` (or istiod): N simulated sidecars, each its own gRPC
//! connection and SotW ADS stream subscribed to CDS, EDS (every cluster it was sent) and LDS,
//! ACKing every response as Envoy does. Then, per round, it edits the config file and measures how
//! long each proxy takes to receive the resulting push (after the server's debounce).
//!
//!   xds-load ADDR CLIENTS CONFIG_FILE ROUNDS DEBOUNCE_MS SERVER_PID[,PID...]
//!
//! Rounds alternate an endpoint-only change (EDS fast path: time to the EDS response) and a full
//! change (a new service: time to the last of CDS, EDS, LDS); changes accumulate, so each round is
//! exactly one of the two. Prints p50/p90/p99 per kind, the server's RSS and its CPU time per
//! round (further PIDs: processes whose CPU is reported beside the server's, e.g. an API server).
//!
//! Env: `XDS_LOAD_META=K=V,K=V` adds string fields to every node's metadata (istiod reads e.g.
//! ISTIO_VERSION, CLUSTER_ID, NAMESPACE from there). `XDS_LOAD_APPLY=COMMAND`: a server that
//! does not read the file (istiod reads the Kubernetes API server): COMMAND (run once, by `sh
//! -c`) answers a first line once it is ready, then is sent each round's changed documents on
//! its stdin, each ending with a line `---`, the round with a line `...`, and answers a line
//! once they are applied; the time is still taken from before the change is handed over.
//! `XDS_LOAD_MESH=kube`: CONFIG_FILE is a Kubernetes mesh (`scripts/gen-mesh.py --kube`: Services
//! and their Pods, a Pod's address its `status.podIP`), so an endpoint round moves the pod at
//! 10.200.0.0 and a full round adds a Service with 10 Pods (the Pods first) instead of a
//! ServiceEntry.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::google::protobuf::{Struct, Value, value};
use futures::StreamExt;
use istiod_core::resource::{CLUSTER_TYPE, ENDPOINT_TYPE, LISTENER_TYPE};
use prost::Message;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, watch};

/// A response's arrival: which client, which type, when.
struct Seen {
    client: usize,
    type_url: String,
    at: Instant,
    /// The response's encoded size.
    bytes: usize,
}

/// Node metadata from `XDS_LOAD_META` (`K=V,K=V`), string values.
fn node_metadata() -> Option<Struct> {
    let spec = std::env::var("XDS_LOAD_META").ok()?;
    let fields = spec
        .split(',')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| {
            let field = Value {
                kind: Some(value::Kind::StringValue(v.to_string())),
            };
            (k.trim().to_string(), field)
        })
        .collect();
    Some(Struct { fields })
}

/// One sidecar. A connection or stream refused, or a stream ended before the initial config, is
/// retried after a back-off on the same connection, as Envoy retries (istiod sheds new streams
/// over its PILOT_MAX_REQUESTS_PER_SECOND).
async fn client(
    addr: String,
    id: usize,
    seen: mpsc::UnboundedSender<Seen>,
    ready: mpsc::UnboundedSender<usize>,
) -> Result<(), String> {
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|e| e.to_string())?;
    let mut attempt: u64 = 0;
    let mut channel = None;
    loop {
        let mut configured = false;
        let result = match &channel {
            Some(c) => stream(c, id, &seen, &ready, &mut configured).await,
            None => match endpoint.connect().await {
                Ok(c) => stream(channel.insert(c), id, &seen, &ready, &mut configured).await,
                Err(e) => Err(e.to_string()),
            },
        };
        if configured || attempt >= 50 {
            return result;
        }
        attempt += 1;
        // 0.5 to 1 s, spread over the clients.
        let jitter = (id as u64 * 7919 + attempt * 104_729) % 500;
        tokio::time::sleep(Duration::from_millis(500 + jitter)).await;
    }
}

async fn stream(
    channel: &tonic::transport::Channel,
    id: usize,
    seen: &mpsc::UnboundedSender<Seen>,
    ready: &mpsc::UnboundedSender<usize>,
    configured: &mut bool,
) -> Result<(), String> {
    let mut ads = AggregatedDiscoveryServiceClient::new(channel.clone())
        .max_decoding_message_size(usize::MAX);
    let (tx, rx) = mpsc::unbounded_channel::<DiscoveryRequest>();
    let node = Node {
        id: format!(
            "sidecar~10.250.{}.{}~load-{id}.load~load.svc.cluster.local",
            id / 256,
            id % 256
        ),
        metadata: node_metadata(),
        ..Default::default()
    };
    let request =
        |type_url: &str, names: Vec<String>, version: &str, nonce: &str| DiscoveryRequest {
            node: Some(node.clone()),
            type_url: type_url.to_string(),
            resource_names: names,
            version_info: version.to_string(),
            response_nonce: nonce.to_string(),
            ..Default::default()
        };
    tx.send(request(CLUSTER_TYPE, vec![], "", ""))
        .map_err(|e| e.to_string())?;
    tx.send(request(LISTENER_TYPE, vec![], "", ""))
        .map_err(|e| e.to_string())?;
    let mut responses = ads
        .stream_aggregated_resources(tokio_stream::wrappers::UnboundedReceiverStream::new(rx))
        .await
        .map_err(|e| e.to_string())?
        .into_inner();
    let mut names: HashMap<String, Vec<String>> = HashMap::new();
    let mut initial = 0;
    while let Some(resp) = responses.next().await {
        let resp = resp.map_err(|e| e.to_string())?;
        let at = Instant::now();
        let bytes = resp.encoded_len();
        if resp.type_url == CLUSTER_TYPE {
            // Subscribe to the EDS clusters, as Envoy does after CDS.
            let eds: Vec<String> = resp
                .resources
                .iter()
                .filter_map(|a| Cluster::decode(a.value.as_slice()).ok())
                .filter(|c| c.eds_cluster_config.is_some())
                .map(|c| c.name)
                .collect();
            if names.get(ENDPOINT_TYPE) != Some(&eds) {
                names.insert(ENDPOINT_TYPE.to_string(), eds.clone());
                tx.send(request(ENDPOINT_TYPE, eds, "", ""))
                    .map_err(|e| e.to_string())?;
            }
        }
        let subscribed = names.get(&resp.type_url).cloned().unwrap_or_default();
        tx.send(request(
            &resp.type_url,
            subscribed,
            &resp.version_info,
            &resp.nonce,
        ))
        .map_err(|e| e.to_string())?;
        initial += 1;
        if initial == 3 {
            *configured = true;
            let _ = ready.send(id);
        }
        let _ = seen.send(Seen {
            client: id,
            type_url: resp.type_url,
            at,
            bytes,
        });
    }
    Ok(())
}

/// The Pods' spec of `scripts/gen-mesh.py --kube` (kept the same there).
const KUBE_POD_SPEC: &str = "{nodeName: bench-node, serviceAccountName: bench-app, automountServiceAccountToken: false, containers: [{name: app, image: bench/app:1, ports: [{name: http, containerPort: 8080}]}]}";

/// A full round's new service under `XDS_LOAD_MESH=kube`: 10 Pods (addresses 10.99.R.1-10),
/// then the Service selecting them, in `scripts/gen-mesh.py --kube`'s shape.
fn kube_service(round: usize) -> String {
    let mut out = String::new();
    for j in 0..10 {
        out.push_str(&format!(
            "\n---\napiVersion: v1\nkind: Pod\nmetadata: {{name: extra{round}-{j}, namespace: load, labels: {{app: extra{round}, version: v1}}}}\nspec: {KUBE_POD_SPEC}\nstatus: {{podIP: 10.99.{}.{}}}\n",
            round % 250 + 1,
            j + 1
        ));
    }
    out.push_str(&format!(
        "\n---\napiVersion: v1\nkind: Service\nmetadata: {{name: extra{round}, namespace: load}}\nspec: {{selector: {{app: extra{round}}}, ports: [{{name: http, port: 80, targetPort: 8080, protocol: TCP}}]}}\n"
    ));
    out
}

fn percentiles(mut v: Vec<Duration>) -> String {
    if v.is_empty() {
        return "no samples".into();
    }
    v.sort();
    let p = |q: f64| v[((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1];
    format!(
        "p50 {:.1} ms, p90 {:.1} ms, p99 {:.1} ms, max {:.1} ms ({} samples)",
        p(0.5).as_secs_f64() * 1e3,
        p(0.9).as_secs_f64() * 1e3,
        p(0.99).as_secs_f64() * 1e3,
        v[v.len() - 1].as_secs_f64() * 1e3,
        v.len()
    )
}

/// utime + stime of process `pid` ("self" for this one), in seconds.
fn cpu_seconds(pid: &str) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // Fields after the command (which may hold spaces): state is field 3, utime 14, stime 15.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // Clock ticks: USER_HZ, 100 on Linux.
    (ticks(11) + ticks(12)) / 100.0
}

/// CPU seconds of the server, of the other processes named, and of this client.
#[derive(Clone, Copy, Default)]
struct Cpu {
    server: f64,
    others: f64,
    client: f64,
}

impl Cpu {
    fn now(pids: &[String]) -> Cpu {
        Cpu {
            server: cpu_seconds(&pids[0]),
            others: pids[1..].iter().map(|p| cpu_seconds(p)).sum(),
            client: cpu_seconds("self"),
        }
    }

    fn since(self, before: Cpu) -> Cpu {
        Cpu {
            server: self.server - before.server,
            others: self.others - before.others,
            client: self.client - before.client,
        }
    }
}

fn cpu_summary(v: &[Cpu], others: bool) -> String {
    if v.is_empty() {
        return "no samples".into();
    }
    let n = v.len() as f64;
    let mean = |f: fn(&Cpu) -> f64| v.iter().map(f).sum::<f64>() / n;
    let max = v.iter().map(|c| c.server).fold(0.0, f64::max);
    let mut out = format!(
        "server {:.3} s (max {:.3} s), client {:.3} s",
        mean(|c| c.server),
        max,
        mean(|c| c.client)
    );
    if others {
        out.push_str(&format!(", other processes {:.3} s", mean(|c| c.others)));
    }
    format!("{out} (mean of {} rounds)", v.len())
}

fn rss_mib(pid: &str) -> f64 {
    status_mib(pid, "VmRSS:")
}

/// The server's peak RSS so far (VmHWM).
fn peak_mib(pid: &str) -> f64 {
    status_mib(pid, "VmHWM:")
}

fn status_mib(pid: &str, field: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1).map(str::to_string))
        })
        .and_then(|kb| kb.parse::<f64>().ok())
        .map(|kb| kb / 1024.0)
        .unwrap_or(0.0)
}

/// The documents of a multi-document YAML text, trimmed, empty ones left out.
fn documents(text: &str) -> Vec<String> {
    let mut docs = vec![String::new()];
    for line in text.lines() {
        if line.trim_end() == "---" {
            docs.push(String::new());
        } else {
            let doc = docs.last_mut().expect("one document at least");
            doc.push_str(line);
            doc.push('\n');
        }
    }
    docs.into_iter()
        .map(|d| d.trim().to_string())
        .filter(|d| !d.is_empty())
        .collect()
}

/// The documents of `new` that `old` does not hold as they are (added or changed).
fn changed_documents(old: &str, new: &str) -> Vec<String> {
    let before: HashSet<String> = documents(old).into_iter().collect();
    documents(new)
        .into_iter()
        .filter(|d| !before.contains(d))
        .collect()
}

/// The `XDS_LOAD_APPLY` command: hands each round's changed documents to the server's source
/// of config (e.g. the Kubernetes API server) and waits for its answer.
struct Applier {
    _child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    stdout: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
}

impl Applier {
    /// Starts the command and waits for its first line (it is connected and ready).
    async fn start() -> Option<Applier> {
        let command = std::env::var("XDS_LOAD_APPLY").ok()?;
        let mut child = tokio::process::Command::new("sh")
            .args(["-c", &command])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("XDS_LOAD_APPLY command");
        let stdin = child.stdin.take().expect("piped stdin");
        let mut stdout =
            tokio::io::BufReader::new(child.stdout.take().expect("piped stdout")).lines();
        match stdout.next_line().await {
            Ok(Some(_)) => {}
            other => panic!("the XDS_LOAD_APPLY command did not start: {other:?}"),
        }
        Some(Applier {
            _child: child,
            stdin,
            stdout,
        })
    }

    async fn apply(&mut self, docs: &[String]) {
        let mut batch = String::new();
        for d in docs {
            batch.push_str(d);
            batch.push_str("\n---\n");
        }
        batch.push_str("...\n");
        self.stdin
            .write_all(batch.as_bytes())
            .await
            .expect("write to the XDS_LOAD_APPLY command");
        self.stdin.flush().await.expect("flush");
        match self.stdout.next_line().await {
            Ok(Some(line)) if line.starts_with("ok") => {}
            Ok(Some(line)) => eprintln!("apply: {line}"),
            other => panic!("the XDS_LOAD_APPLY command ended: {other:?}"),
        }
    }
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 7 {
        eprintln!(
            "usage: xds-load ADDR CLIENTS CONFIG_FILE ROUNDS DEBOUNCE_MS SERVER_PID[,PID...]\n\
             env: XDS_LOAD_META=K=V,..., XDS_LOAD_APPLY=COMMAND, XDS_LOAD_MESH=kube"
        );
        std::process::exit(2);
    }
    let (addr, clients, file, rounds, debounce, pids) = (
        args[1].clone(),
        args[2].parse::<usize>().expect("CLIENTS"),
        std::path::PathBuf::from(&args[3]),
        args[4].parse::<usize>().expect("ROUNDS"),
        Duration::from_millis(args[5].parse().expect("DEBOUNCE_MS")),
        args[6].split(',').map(str::to_string).collect::<Vec<_>>(),
    );
    let pid = pids[0].clone();
    let kube = std::env::var("XDS_LOAD_MESH").is_ok_and(|m| m == "kube");
    let others = pids.len() > 1;
    let (seen_tx, mut seen_rx) = mpsc::unbounded_channel();
    let (ready_tx, mut ready_rx) = mpsc::unbounded_channel();
    let (_stop_tx, _stop_rx) = watch::channel(());
    let start = Instant::now();
    let mut applier = Applier::start().await;
    let cpu_start = Cpu::now(&pids);
    for id in 0..clients {
        let (addr, seen, ready) = (addr.clone(), seen_tx.clone(), ready_tx.clone());
        tokio::spawn(async move {
            if let Err(e) = client(addr, id, seen, ready).await {
                eprintln!("client {id}: {e}");
            }
        });
    }
    let mut ready = 0;
    while ready < clients {
        tokio::time::timeout(Duration::from_secs(300), ready_rx.recv())
            .await
            .expect("clients did not all get their initial config within 300 s");
        ready += 1;
    }
    let configured = start.elapsed();
    let cpu_configured = Cpu::now(&pids).since(cpu_start);
    // Let the initial EDS subscriptions settle.
    tokio::time::sleep(Duration::from_secs(2)).await;
    while seen_rx.try_recv().is_ok() {}
    println!(
        "{clients} clients connected and configured in {:.1} s; server RSS {:.1} MiB (peak {:.1} MiB)",
        configured.as_secs_f64(),
        rss_mib(&pid),
        peak_mib(&pid)
    );
    println!(
        "CPU to configure them: {}",
        cpu_summary(&[cpu_configured], others)
    );
    let original = std::fs::read_to_string(&file).expect("config file");
    let mut current = original.clone();
    // Changes accumulate: an endpoint round moves one endpoint of the first service and keeps
    // the services added so far; a full round adds a service and keeps the endpoint.
    let mut endpoint = "10.200.0.0".to_string();
    let mut extras = String::new();
    let (mut eds_times, mut full_times) = (Vec::new(), Vec::new());
    let (mut eds_raw, mut full_raw) = (Vec::new(), Vec::new());
    let (mut eds_cpu, mut full_cpu) = (Vec::new(), Vec::new());
    let mut apply_times = Vec::new();
    for round in 0..rounds {
        let full = round % 2 == 1;
        if full && kube {
            extras.push_str(&kube_service(round));
        } else if full {
            extras.push_str(&format!(
                "\n---\napiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {{name: extra{round}, namespace: load}}\nspec: {{hosts: [extra{round}.load.svc.cluster.local], location: MESH_INTERNAL, resolution: STATIC, ports: [{{number: 80, name: http}}], endpoints: [{{address: 10.99.0.{}}}]}}\n",
                round % 250 + 1
            ));
        } else {
            endpoint = format!("10.199.0.{}", round % 250 + 1);
        }
        let text = format!("{}{extras}", original.replacen("10.200.0.0", &endpoint, 1));
        let changed = changed_documents(&current, &text);
        let cpu0 = Cpu::now(&pids);
        let t0 = Instant::now();
        std::fs::write(&file, &text).expect("write config");
        let mut applied = None;
        if let Some(a) = applier.as_mut() {
            a.apply(&changed).await;
            applied = Some(t0.elapsed());
            apply_times.push(t0.elapsed());
        }
        current = text;
        let want: &[&str] = if full {
            &[CLUSTER_TYPE, ENDPOINT_TYPE, LISTENER_TYPE]
        } else {
            &[ENDPOINT_TYPE]
        };
        let mut got: HashMap<usize, Vec<(String, Instant)>> = HashMap::new();
        let deadline = t0 + Duration::from_secs(60);
        let mut done = 0;
        let mut received = 0;
        while done < clients && Instant::now() < deadline {
            let Ok(Some(s)) = tokio::time::timeout(Duration::from_secs(10), seen_rx.recv()).await
            else {
                break;
            };
            received += s.bytes;
            let entry = got.entry(s.client).or_default();
            let before = want.iter().all(|w| entry.iter().any(|(t, _)| t == w));
            entry.push((s.type_url, s.at));
            let after = want.iter().all(|w| entry.iter().any(|(t, _)| t == w));
            if after && !before {
                done += 1;
            }
        }
        let mut round_raw = Vec::new();
        for entries in got.values() {
            if want.iter().all(|w| entries.iter().any(|(t, _)| t == w)) {
                let last = entries
                    .iter()
                    .filter(|(t, _)| want.contains(&t.as_str()))
                    .map(|(_, at)| *at)
                    .max()
                    .unwrap_or(t0);
                round_raw.push(last.duration_since(t0));
            }
        }
        let took = round_raw.iter().map(|raw| raw.saturating_sub(debounce));
        if full {
            full_times.extend(took);
            full_raw.extend(&round_raw);
        } else {
            eds_times.extend(took);
            eds_raw.extend(&round_raw);
        }
        if done < clients {
            eprintln!("round {round}: only {done} of {clients} clients converged");
        }
        // Quiet between rounds, so each is its own debounce window.
        tokio::time::sleep(Duration::from_millis(500)).await;
        while let Ok(s) = seen_rx.try_recv() {
            received += s.bytes;
        }
        let cpu = Cpu::now(&pids).since(cpu0);
        round_raw.sort();
        println!(
            "round {round} ({}): {}from the change: first {:.1} ms, p50 {:.1} ms, last {:.1} ms; server CPU {:.3} s; {:.1} MB received",
            if full { "new service" } else { "endpoint" },
            applied
                .map(|a| format!("applied in {:.1} ms; ", a.as_secs_f64() * 1e3))
                .unwrap_or_default(),
            round_raw.first().map_or(0.0, |d| d.as_secs_f64() * 1e3),
            round_raw
                .get(round_raw.len() / 2)
                .map_or(0.0, |d| d.as_secs_f64() * 1e3),
            round_raw.last().map_or(0.0, |d| d.as_secs_f64() * 1e3),
            cpu.server,
            received as f64 / 1e6
        );
        if full {
            full_cpu.push(cpu);
        } else {
            eds_cpu.push(cpu);
        }
    }
    std::fs::write(&file, original).expect("restore config");
    println!(
        "endpoint change -> EDS at every proxy, after the debounce: {}",
        percentiles(eds_times)
    );
    println!(
        "new service -> CDS+EDS+LDS at every proxy, after the debounce: {}",
        percentiles(full_times)
    );
    println!(
        "endpoint change -> EDS at every proxy, from the change: {}",
        percentiles(eds_raw)
    );
    println!(
        "new service -> CDS+EDS+LDS at every proxy, from the change: {}",
        percentiles(full_raw)
    );
    if !apply_times.is_empty() {
        println!(
            "applying a change (included above): {}",
            percentiles(apply_times)
        );
    }
    println!(
        "CPU per endpoint-change round: {}",
        cpu_summary(&eds_cpu, others)
    );
    println!(
        "CPU per new-service round (full push): {}",
        cpu_summary(&full_cpu, others)
    );
    println!(
        "server RSS after the rounds: {:.1} MiB; peak RSS of the whole run: {:.1} MiB",
        rss_mib(&pid),
        peak_mib(&pid)
    );
}
