//! A load client for `istiod-core serve`: N simulated sidecars, each its own gRPC connection
//! and SotW ADS stream subscribed to CDS, EDS (every cluster it was sent) and LDS, ACKing every
//! response as Envoy does. Then, per round, it edits the config file and measures how long each
//! proxy takes to receive the resulting push (after the server's debounce).
//!
//!   xds-load ADDR CLIENTS CONFIG_FILE ROUNDS DEBOUNCE_MS SERVER_PID
//!
//! Rounds alternate an endpoint-only change (EDS fast path: time to the EDS response) and a full
//! change (a new service: time to the last of CDS, EDS, LDS). Prints p50/p90/p99 per kind and the
//! server's RSS.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use futures::StreamExt;
use istiod_core::generators::{CLUSTER_TYPE, ENDPOINT_TYPE, LISTENER_TYPE};
use prost::Message;
use tokio::sync::{mpsc, watch};

/// A response's arrival: which client, which type, when.
struct Seen {
    client: usize,
    type_url: String,
    at: Instant,
}

async fn client(
    addr: String,
    id: usize,
    seen: mpsc::UnboundedSender<Seen>,
    ready: mpsc::UnboundedSender<usize>,
) -> Result<(), String> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|e| e.to_string())?
        .connect()
        .await
        .map_err(|e| e.to_string())?;
    let mut ads =
        AggregatedDiscoveryServiceClient::new(channel).max_decoding_message_size(usize::MAX);
    let (tx, rx) = mpsc::unbounded_channel::<DiscoveryRequest>();
    let node = Node {
        id: format!(
            "sidecar~10.250.{}.{}~load-{id}.load~load.svc.cluster.local",
            id / 256,
            id % 256
        ),
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
            let _ = ready.send(id);
        }
        let _ = seen.send(Seen {
            client: id,
            type_url: resp.type_url,
            at,
        });
    }
    Ok(())
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

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 7 {
        eprintln!("usage: xds-load ADDR CLIENTS CONFIG_FILE ROUNDS DEBOUNCE_MS SERVER_PID");
        std::process::exit(2);
    }
    let (addr, clients, file, rounds, debounce, pid) = (
        args[1].clone(),
        args[2].parse::<usize>().expect("CLIENTS"),
        std::path::PathBuf::from(&args[3]),
        args[4].parse::<usize>().expect("ROUNDS"),
        Duration::from_millis(args[5].parse().expect("DEBOUNCE_MS")),
        args[6].clone(),
    );
    let (seen_tx, mut seen_rx) = mpsc::unbounded_channel();
    let (ready_tx, mut ready_rx) = mpsc::unbounded_channel();
    let (_stop_tx, _stop_rx) = watch::channel(());
    let start = Instant::now();
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
    // Let the initial EDS subscriptions settle.
    tokio::time::sleep(Duration::from_secs(2)).await;
    while seen_rx.try_recv().is_ok() {}
    println!(
        "{clients} clients connected and configured in {:.1} s; server RSS {:.1} MiB (peak {:.1} MiB)",
        start.elapsed().as_secs_f64(),
        rss_mib(&pid),
        peak_mib(&pid)
    );
    let original = std::fs::read_to_string(&file).expect("config file");
    let mut eds_times = Vec::new();
    let mut full_times = Vec::new();
    for round in 0..rounds {
        let full = round % 2 == 1;
        // Endpoint-only: move one endpoint of the first service; full: add a service.
        let text = if full {
            format!(
                "{original}\n---\nkind: ServiceEntry\nmetadata: {{name: extra{round}, namespace: load}}\nspec: {{hosts: [extra{round}.load.svc.cluster.local], ports: [{{number: 80, name: http}}], endpoints: [{{address: 10.99.0.{}}}]}}\n",
                round % 250 + 1
            )
        } else {
            original.replacen("10.200.0.0", &format!("10.199.0.{}", round % 250 + 1), 1)
        };
        let t0 = Instant::now();
        std::fs::write(&file, text).expect("write config");
        let want: &[&str] = if full {
            &[CLUSTER_TYPE, ENDPOINT_TYPE, LISTENER_TYPE]
        } else {
            &[ENDPOINT_TYPE]
        };
        let mut got: HashMap<usize, Vec<(String, Instant)>> = HashMap::new();
        let deadline = t0 + Duration::from_secs(60);
        let mut done = 0;
        while done < clients && Instant::now() < deadline {
            let Ok(Some(s)) = tokio::time::timeout(Duration::from_secs(10), seen_rx.recv()).await
            else {
                break;
            };
            let entry = got.entry(s.client).or_default();
            let before = want.iter().all(|w| entry.iter().any(|(t, _)| t == w));
            entry.push((s.type_url, s.at));
            let after = want.iter().all(|w| entry.iter().any(|(t, _)| t == w));
            if after && !before {
                done += 1;
            }
        }
        for entries in got.values() {
            if want.iter().all(|w| entries.iter().any(|(t, _)| t == w)) {
                let last = entries
                    .iter()
                    .filter(|(t, _)| want.contains(&t.as_str()))
                    .map(|(_, at)| *at)
                    .max()
                    .unwrap_or(t0);
                let took = last.duration_since(t0).saturating_sub(debounce);
                if full {
                    full_times.push(took);
                } else {
                    eds_times.push(took);
                }
            }
        }
        if done < clients {
            eprintln!("round {round}: only {done} of {clients} clients converged");
        }
        // Quiet between rounds, so each is its own debounce window.
        tokio::time::sleep(Duration::from_millis(500)).await;
        while seen_rx.try_recv().is_ok() {}
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
        "server RSS after the rounds: {:.1} MiB; peak RSS of the whole run: {:.1} MiB",
        rss_mib(&pid),
        peak_mib(&pid)
    );
}
