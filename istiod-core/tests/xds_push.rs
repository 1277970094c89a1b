#![allow(clippy::unwrap_used)] // test code: a panic is the failure report
//! Pushes as proxies see them, over the in-process ADS server: the EDS fast path (an
//! endpoint-only change reaches a proxy as EDS alone, and not at all if it watches none of the
//! changed clusters), full pushes for the proxy whose own workload changed, /debug/syncz, the
//! stream limit and the debug port.

use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use futures::StreamExt;
use istiod_core::ControlPlane;
use istiod_core::autoregister::Caller;
use istiod_core::resource::{CLUSTER_TYPE, ENDPOINT_TYPE, LISTENER_TYPE};
use istiod_core::xds_server::Requests;
use prost::Message;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

fn mesh(web_ips: &[&str]) -> String {
    let mut yaml = String::from(
        "kind: ServiceEntry\nmetadata: {name: web, namespace: shop}\nspec:\n  hosts: [web.shop.svc.cluster.local]\n  addresses: [10.96.0.1]\n  ports: [{number: 80, name: http}]\n  workloadSelector: {labels: {app: web}}\n---\nkind: ServiceEntry\nmetadata: {name: db, namespace: shop}\nspec:\n  hosts: [db.shop.svc.cluster.local]\n  addresses: [10.96.0.2]\n  ports: [{number: 5432, name: tcp}]\n  endpoints: [{address: 10.1.0.9, serviceAccount: db}]\n",
    );
    for (i, ip) in web_ips.iter().enumerate() {
        yaml.push_str(&format!(
            "---\nkind: WorkloadEntry\nmetadata: {{name: web-{i}, namespace: shop}}\nspec: {{address: {ip}, labels: {{app: web}}, serviceAccount: web}}\n"
        ));
    }
    yaml
}

/// The control plane of `dir`, its generator cache in the checked mode: every proxy after the
/// first reads the shared resources, which are generated again and compared
/// (`GenCache::checked`).
fn checked(dir: &std::path::Path) -> std::sync::Arc<ControlPlane> {
    ControlPlane::open(istiod_core::Settings {
        config_dir: Some(dir.to_path_buf()),
        cache_check: true,
        ..Default::default()
    })
    .unwrap()
}

struct Client {
    tx: mpsc::Sender<Result<DiscoveryRequest, Status>>,
    rx: std::pin::Pin<Box<dyn futures::Stream<Item = Result<DiscoveryResponse, Status>> + Send>>,
    node: Node,
    /// What this client subscribed to per type (repeated in every ACK, as Envoy does).
    names: std::collections::HashMap<String, Vec<String>>,
    /// The cluster names of the last EDS response's endpoints.
    eds_sent: Vec<String>,
}

impl Client {
    fn new(server: &istiod_core::xds_server::XdsServer, ip: &str) -> Client {
        Client::of(server, ip, Caller::InProcess)
    }

    fn of(server: &istiod_core::xds_server::XdsServer, ip: &str, caller: Caller) -> Client {
        let (tx, rx) = mpsc::channel(16);
        let responses = server
            .open(Requests::Sotw(Box::pin(ReceiverStream::new(rx))), caller)
            .map(|r| {
                r.and_then(|out| {
                    out.decode::<DiscoveryResponse>()
                        .map_err(|e| Status::internal(e.to_string()))
                })
            });
        Client {
            tx,
            rx: Box::pin(responses),
            node: Node {
                id: format!("sidecar~{ip}~p-{ip}.shop~shop.svc.cluster.local"),
                ..Default::default()
            },
            names: Default::default(),
            eds_sent: Vec::new(),
        }
    }

    async fn request(&self, type_url: &str, names: &[&str], nonce: &str) {
        self.tx
            .send(Ok(DiscoveryRequest {
                node: Some(self.node.clone()),
                type_url: type_url.to_string(),
                resource_names: names.iter().map(|s| s.to_string()).collect(),
                response_nonce: nonce.to_string(),
                ..Default::default()
            }))
            .await
            .unwrap();
    }

    async fn next(&mut self) -> Option<DiscoveryResponse> {
        self.next_within(Duration::from_secs(2)).await
    }

    async fn next_within(&mut self, limit: Duration) -> Option<DiscoveryResponse> {
        tokio::time::timeout(limit, self.rx.next())
            .await
            .ok()
            .flatten()
            .map(|r| r.unwrap())
    }

    /// Subscribes to CDS, LDS and the web cluster's EDS, ACKing each.
    async fn subscribe(&mut self, eds: &[&str]) {
        for (t, names) in [
            (CLUSTER_TYPE, &[][..]),
            (ENDPOINT_TYPE, eds),
            (LISTENER_TYPE, &[][..]),
        ] {
            self.names
                .insert(t.to_string(), names.iter().map(|s| s.to_string()).collect());
            self.request(t, names, "").await;
            let resp = self.next().await.unwrap();
            self.request(t, names, &resp.nonce).await;
        }
    }

    /// Type URLs of everything pushed: the first response within 2 s, each next within 0.6 s.
    async fn pushed(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        let mut limit = Duration::from_secs(2);
        while let Some(resp) = self.next_within(limit).await {
            limit = Duration::from_millis(600);
            let names = self.names.get(&resp.type_url).cloned().unwrap_or_default();
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            self.request(&resp.type_url, &names, &resp.nonce).await;
            if resp.type_url == ENDPOINT_TYPE {
                self.eds_sent = resp
                    .resources
                    .iter()
                    .map(|a| {
                        envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment::decode(
                            a.value.as_slice(),
                        )
                        .unwrap()
                        .cluster_name
                    })
                    .collect();
            }
            out.push(resp.type_url);
        }
        out
    }
}

#[tokio::test]
async fn endpoint_changes_take_the_eds_fast_path() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("mesh.yaml"), mesh(&["10.1.0.1"])).unwrap();
    let cp = checked(dir.path());
    let server = cp.xds();
    let web = "outbound|80||web.shop.svc.cluster.local";
    let db = "outbound|5432||db.shop.svc.cluster.local";
    // A client of web, a proxy that only talks to db, and web's own workload (10.1.0.1).
    let mut client = Client::new(&server, "10.1.0.50");
    client.subscribe(&[web, db]).await;
    let mut db_only = Client::new(&server, "10.1.0.51");
    db_only.subscribe(&[db]).await;
    let mut owner = Client::new(&server, "10.1.0.1");
    owner.subscribe(&[web, db]).await;

    // A second web endpoint with the same identity: endpoints only.
    std::fs::write(
        dir.path().join("mesh.yaml"),
        mesh(&["10.1.0.1", "10.1.0.2"]),
    )
    .unwrap();
    cp.reload().unwrap();
    assert!(matches!(
        cp.snapshot().change,
        istiod_core::push_context::Change::Endpoints(_)
    ));
    assert_eq!(client.pushed().await, vec![ENDPOINT_TYPE]);
    // Only the changed cluster's endpoints: Envoy keeps those of the clusters left out.
    assert_eq!(client.eds_sent, vec![web.to_string()]);
    assert_eq!(db_only.pushed().await, Vec::<String>::new());
    let owner_types = owner.pushed().await;
    assert!(
        owner_types.contains(&LISTENER_TYPE.to_string()),
        "{owner_types:?}"
    );

    // Removing web's own workload changes its inbound: still endpoints-only globally, but the
    // proxy that was the endpoint gets a full push.
    std::fs::write(dir.path().join("mesh.yaml"), mesh(&["10.1.0.2"])).unwrap();
    cp.reload().unwrap();
    assert_eq!(client.pushed().await, vec![ENDPOINT_TYPE]);
    assert!(owner.pushed().await.contains(&CLUSTER_TYPE.to_string()));

    // A new service is a full push for everyone.
    let mut yaml = mesh(&["10.1.0.2"]);
    yaml.push_str("---\nkind: ServiceEntry\nmetadata: {name: api, namespace: shop}\nspec: {hosts: [api.example], ports: [{number: 8080, name: http}]}\n");
    std::fs::write(dir.path().join("mesh.yaml"), yaml).unwrap();
    cp.reload().unwrap();
    let types = db_only.pushed().await;
    assert!(types.contains(&CLUSTER_TYPE.to_string()), "{types:?}");
    assert!(types.contains(&LISTENER_TYPE.to_string()), "{types:?}");

    client.pushed().await;
    owner.pushed().await;
    // syncz: every type ACKed at the version sent.
    let syncz = server.syncz();
    assert_eq!(syncz.len(), 3);
    for proxy in &syncz {
        for (t, s) in &proxy.types {
            assert_eq!(s.acked, s.sent, "{} {t}", proxy.proxy);
            assert!(s.nacked.is_none());
        }
    }
}

/// A proxy that watches only a DestinationRule subset's cluster gets the EDS fast path too,
/// with the subset's endpoints only.
#[tokio::test]
async fn subset_clusters_take_the_eds_fast_path() {
    let rule = "---\nkind: DestinationRule\nmetadata: {name: web, namespace: shop}\nspec: {host: web, subsets: [{name: v1, labels: {version: v1}}]}\n";
    let with = |ips: &[&str]| {
        // Every web workload but 10.1.0.9 is version v1.
        format!("{}{rule}", mesh(ips)).replace(
            "labels: {app: web}, serviceAccount: web}",
            "labels: {app: web, version: v1}, serviceAccount: web}",
        ) + "---\nkind: WorkloadEntry\nmetadata: {name: web-v2, namespace: shop}\nspec: {address: 10.1.0.9, labels: {app: web, version: v2}, serviceAccount: web}\n"
    };
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("mesh.yaml"), with(&["10.1.0.1"])).unwrap();
    let cp = checked(dir.path());
    let server = cp.xds();
    let v1 = "outbound|80|v1|web.shop.svc.cluster.local";
    let mut client = Client::new(&server, "10.1.0.50");
    client.subscribe(&[v1]).await;

    std::fs::write(
        dir.path().join("mesh.yaml"),
        with(&["10.1.0.1", "10.1.0.2"]),
    )
    .unwrap();
    cp.reload().unwrap();
    assert!(matches!(
        cp.snapshot().change,
        istiod_core::push_context::Change::Endpoints(_)
    ));
    let resp = client
        .next()
        .await
        .expect("EDS push for the subset cluster");
    assert_eq!(resp.type_url, ENDPOINT_TYPE);
    let cla = envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment::decode(
        resp.resources[0].value.as_slice(),
    )
    .unwrap();
    assert_eq!(cla.cluster_name, v1);
    let text = format!("{cla:?}");
    assert!(
        text.contains("10.1.0.1") && text.contains("10.1.0.2"),
        "{text}"
    );
    assert!(
        !text.contains("10.1.0.9"),
        "the v2 workload is not in v1: {text}"
    );
}

#[tokio::test]
async fn streams_beyond_the_limit_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("mesh.yaml"), mesh(&["10.1.0.1"])).unwrap();
    let cp = checked(dir.path());
    let server = cp.xds_with_limits(1, 10);
    let mut first = Client::new(&server, "10.1.0.50");
    first.request(CLUSTER_TYPE, &[], "").await;
    assert!(first.next().await.is_some());
    let mut second = Client::new(&server, "10.1.0.51");
    let err = second.rx.next().await.unwrap().unwrap_err();
    assert_eq!(err.code(), tonic::Code::ResourceExhausted);
    // The slot frees when the first stream ends.
    drop(first);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut third = Client::new(&server, "10.1.0.52");
    third.request(CLUSTER_TYPE, &[], "").await;
    assert!(third.next().await.is_some());
}

/// A response over the server's size bound is not sent: the stream ends with
/// RESOURCE_EXHAUSTED naming the size, and smaller responses still flow on other streams.
#[tokio::test]
async fn responses_over_the_size_bound_end_the_stream() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("mesh.yaml"), mesh(&["10.1.0.1"])).unwrap();
    let cp = checked(dir.path());
    let mut probe = Client::new(&cp.xds(), "10.1.0.50");
    probe.request(CLUSTER_TYPE, &[], "").await;
    let size = probe.next().await.unwrap().encoded_len();
    let bounded = cp.xds().with_max_response_bytes(size - 1);
    let mut client = Client::new(&bounded, "10.1.0.50");
    client.request(CLUSTER_TYPE, &[], "").await;
    let err = match tokio::time::timeout(Duration::from_secs(10), client.rx.next())
        .await
        .unwrap()
        .unwrap()
    {
        Ok(r) => panic!(
            "a response over the bound was sent ({} bytes)",
            r.encoded_len()
        ),
        Err(e) => e,
    };
    assert_eq!(err.code(), tonic::Code::ResourceExhausted, "{err:?}");
    assert!(err.message().contains(&format!("{size} bytes")), "{err:?}");
    assert!(client.rx.next().await.is_none(), "the stream went on");
}

#[tokio::test]
async fn debug_port_serves_syncz_configz_and_registryz() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("mesh.yaml"), mesh(&["10.1.0.1"])).unwrap();
    let cp = checked(dir.path());
    let server = cp.xds();
    let mut client = Client::new(&server, "10.1.0.50");
    client.subscribe(&[]).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(istiod_core::debug::serve(
        listener,
        cp.clone(),
        server.clone(),
        std::future::pending(),
    ));
    let get = |path: &'static str| async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        let body = out.split_once("\r\n\r\n").unwrap().1.to_string();
        serde_json::from_str::<serde_json::Value>(&body).unwrap()
    };
    let syncz = get("/debug/syncz").await;
    assert_eq!(syncz[0]["proxy"], "p-10.1.0.50.shop");
    assert!(syncz[0]["types"][CLUSTER_TYPE]["acked"].is_string());
    // istiod's fields beside ours.
    assert_eq!(syncz[0]["proxy_type"], "sidecar");
    assert_eq!(syncz[0]["cluster_acked"], syncz[0]["cluster_sent"]);
    assert!(syncz[0]["resources"][CLUSTER_TYPE]["sentTime"].is_string());
    let dump = get("/debug/config_dump?proxyID=p-10.1.0.50.shop").await;
    let clusters = dump["configs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["@type"] == "type.googleapis.com/envoy.admin.v3.ClustersConfigDump")
        .unwrap();
    let names: Vec<&str> = clusters["dynamicActiveClusters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["cluster"]["name"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"outbound|80||web.shop.svc.cluster.local"),
        "{names:?}"
    );
    assert_eq!(
        clusters["dynamicActiveClusters"][0]["cluster"]["@type"],
        "type.googleapis.com/envoy.config.cluster.v3.Cluster"
    );
    let adsz = get("/debug/adsz").await;
    assert_eq!(adsz["totalClients"], 1);
    assert_eq!(adsz["clients"][0]["connectionId"], "p-10.1.0.50.shop");
    assert_eq!(adsz["clients"][0]["address"], "10.1.0.50");
    assert!(adsz["clients"][0]["watches"][ENDPOINT_TYPE].is_array());
    let configz = get("/debug/configz").await;
    assert_eq!(configz.as_array().unwrap().len(), 3);
    assert_eq!(configz[0]["kind"], "ServiceEntry");
    let registryz = get("/debug/registryz").await;
    let hosts: Vec<&str> = registryz["services"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["hostname"].as_str().unwrap())
        .collect();
    assert_eq!(
        hosts,
        vec!["db.shop.svc.cluster.local", "web.shop.svc.cluster.local"]
    );
}

#[tokio::test]
async fn the_in_memory_store_drives_pushes_through_the_debounce() {
    let cp = ControlPlane::in_memory("cluster.local").unwrap();
    tokio::spawn(cp.clone().watch(istiod_core::Debounce {
        after: Duration::from_millis(20),
        max: Duration::from_secs(1),
    }));
    let server = cp.xds();
    let mut client = Client::new(&server, "10.1.0.50");
    client.subscribe(&[]).await;
    let se = |host: &str| {
        istiod_core::config_store::parse_file(
            std::path::Path::new("mem.yaml"),
            &format!(
                "kind: ServiceEntry\nmetadata: {{name: {host}, namespace: shop}}\nspec: {{hosts: [{host}.example], ports: [{{number: 80, name: http}}]}}\n"
            ),
        )
        .unwrap()
        .remove(0)
    };
    // Two applies in one burst: one push.
    cp.memory().apply(se("a"));
    cp.memory().apply(se("b"));
    let types = client.pushed().await;
    assert_eq!(
        types.iter().filter(|t| *t == CLUSTER_TYPE).count(),
        1,
        "{types:?}"
    );
    let hosts: Vec<String> = cp
        .snapshot()
        .services
        .iter()
        .map(|s| s.hostname.clone())
        .collect();
    assert_eq!(hosts, vec!["a.example", "b.example"]);
    assert!(cp.memory().delete("ServiceEntry", "shop", "a"));
    assert!(client.pushed().await.contains(&CLUSTER_TYPE.to_string()));
    assert_eq!(cp.snapshot().services.len(), 1);
}

#[tokio::test]
async fn a_proxy_that_stops_reading_does_not_stall_the_others() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("mesh.yaml"), mesh(&["10.1.0.1"])).unwrap();
    let cp = checked(dir.path());
    // One push may be generated at a time: a stuck stream holding it would stall everyone.
    let server = cp.xds_with_limits(100, 1);
    let stuck = Client::new(&server, "10.1.0.60");
    stuck.request(CLUSTER_TYPE, &[], "").await;
    stuck.request(LISTENER_TYPE, &[], "").await;
    let mut healthy = Client::new(&server, "10.1.0.61");
    healthy.subscribe(&[]).await;
    // Several full pushes: the stuck stream's buffer fills and its sends block.
    for i in 0..6 {
        let mut yaml = mesh(&["10.1.0.1"]);
        yaml.push_str(&format!(
            "---\nkind: ServiceEntry\nmetadata: {{name: x{i}, namespace: shop}}\nspec: {{hosts: [x{i}.example], ports: [{{number: 80, name: http}}]}}\n"
        ));
        std::fs::write(dir.path().join("mesh.yaml"), yaml).unwrap();
        cp.reload().unwrap();
        let types = healthy.pushed().await;
        assert!(
            types.contains(&CLUSTER_TYPE.to_string()),
            "push {i}: {types:?}"
        );
    }
    drop(stuck);
}

#[test]
fn peer_identities_follow_the_trust_domain() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("mesh.yaml"), mesh(&["10.1.0.1"])).unwrap();
    let cp = ControlPlane::open(istiod_core::Settings {
        config_dir: Some(dir.path().to_path_buf()),
        trust_domain: "example.org".into(),
        ..Default::default()
    })
    .unwrap();
    let proxy =
        istiod_core::model::Proxy::from_node_id("sidecar~10.1.0.50~c.shop~shop.svc.cluster.local")
            .unwrap();
    let clusters = istiod_core::generators::cds::generate(&cp.snapshot(), &proxy);
    let web = clusters
        .iter()
        .find(|n| n.name == "outbound|80||web.shop.svc.cluster.local")
        .unwrap();
    let bytes = String::from_utf8_lossy(&web.resource.value).to_string();
    assert!(
        bytes.contains("spiffe://example.org/ns/shop/sa/web"),
        "{bytes:?}"
    );
    assert!(!bytes.contains("spiffe://cluster.local/"));
}

fn group_mesh() -> &'static str {
    "kind: ServiceEntry\nmetadata: {name: vm-svc, namespace: vms}\nspec:\n  hosts: [vm-svc.vms.svc.cluster.local]\n  ports: [{number: 8080, name: http}]\n  workloadSelector: {labels: {app: vm}}\n---\nkind: WorkloadGroup\nmetadata: {name: vm, namespace: vms}\nspec:\n  metadata: {labels: {app: vm}}\n  template: {serviceAccount: vm-sa, ports: {http: 18080}}\n"
}

fn registering_node(ip: &str, group: &str) -> Node {
    use envoy_types::pb::google::protobuf::{Struct, Value, value::Kind};
    Node {
        id: format!("sidecar~{ip}~vm-1.vms~vms.svc.cluster.local"),
        metadata: Some(Struct {
            fields: [(
                "AUTO_REGISTER_GROUP".to_string(),
                Value {
                    kind: Some(Kind::StringValue(group.to_string())),
                },
            )]
            .into(),
        }),
        ..Default::default()
    }
}

fn vm_endpoints(cp: &ControlPlane) -> Vec<String> {
    cp.snapshot()
        .services
        .iter()
        .filter(|s| s.hostname == "vm-svc.vms.svc.cluster.local")
        .flat_map(|s| &s.endpoints)
        .map(|e| format!("{} {:?} {}", e.address, e.ports, e.service_account))
        .collect()
}

/// WorkloadEntry auto-registration: a proxy naming a WorkloadGroup becomes an endpoint of the
/// services selecting the group while it is connected, and for a grace period after.
#[tokio::test]
async fn proxies_register_themselves_in_their_workload_group() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("mesh.yaml"), group_mesh()).unwrap();
    let cp = checked(dir.path());
    cp.auto_registration().set_grace(Duration::from_millis(300));
    let server = cp.xds();
    assert!(vm_endpoints(&cp).is_empty());

    let mut vm = Client::new(&server, "10.2.0.7");
    vm.node = registering_node("10.2.0.7", "vm");
    vm.request(CLUSTER_TYPE, &[], "").await;
    assert!(vm.next().await.is_some());
    cp.reload().unwrap();
    assert_eq!(
        vm_endpoints(&cp),
        ["10.2.0.7 {\"http\": 18080} vm-sa".to_string()]
    );

    // Gone for longer than the grace period: removed.
    drop(vm);
    tokio::time::sleep(Duration::from_millis(700)).await;
    cp.reload().unwrap();
    assert!(vm_endpoints(&cp).is_empty());

    // Back within the grace period: kept.
    let mut again = Client::new(&server, "10.2.0.7");
    again.node = registering_node("10.2.0.7", "vm");
    again.request(CLUSTER_TYPE, &[], "").await;
    assert!(again.next().await.is_some());
    drop(again);
    let mut back = Client::new(&server, "10.2.0.7");
    back.node = registering_node("10.2.0.7", "vm");
    back.request(CLUSTER_TYPE, &[], "").await;
    assert!(back.next().await.is_some());
    tokio::time::sleep(Duration::from_millis(700)).await;
    cp.reload().unwrap();
    assert_eq!(vm_endpoints(&cp).len(), 1);

    // A group that does not exist ends the stream with the reason.
    let mut lost = Client::new(&server, "10.2.0.8");
    lost.node = registering_node("10.2.0.8", "nope");
    lost.request(CLUSTER_TYPE, &[], "").await;
    let err = lost.rx.next().await.unwrap().unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition);
    assert!(err.message().contains("vms/nope"), "{}", err.message());
}

/// A proxy with a readiness probe (ProxyConfig in its node metadata) registers a health-checked
/// entry: no endpoint until it reports healthy, none again while it reports unhealthy, as
/// istiod's health controller; a report before the proxy is known is dropped.
#[tokio::test]
async fn a_health_checked_entry_is_an_endpoint_only_while_its_reports_say_healthy() {
    use envoy_types::pb::google::protobuf::{Struct, Value, value::Kind};
    use envoy_types::pb::google::rpc::Status as RpcStatus;
    use mesh_common::xds::HEALTH_INFO_TYPE;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("mesh.yaml"), group_mesh()).unwrap();
    let cp = checked(dir.path());
    let server = cp.xds();
    let mut node = registering_node("10.2.0.7", "vm");
    let probe = Struct {
        fields: [(
            "readinessProbe".to_string(),
            Value {
                kind: Some(Kind::StructValue(Struct {
                    fields: [(
                        "periodSeconds".to_string(),
                        Value {
                            kind: Some(Kind::NumberValue(1.0)),
                        },
                    )]
                    .into(),
                })),
            },
        )]
        .into(),
    };
    node.metadata.as_mut().unwrap().fields.insert(
        "PROXY_CONFIG".into(),
        Value {
            kind: Some(Kind::StructValue(probe)),
        },
    );
    let report = |error: Option<&str>| {
        Ok(DiscoveryRequest {
            type_url: HEALTH_INFO_TYPE.into(),
            error_detail: error.map(|m| RpcStatus {
                code: 13,
                message: m.into(),
                details: vec![],
            }),
            ..Default::default()
        })
    };

    // A report as the first message of a stream: dropped (the proxy is not known yet).
    let mut vm = Client::new(&server, "10.2.0.7");
    vm.node = node.clone();
    vm.tx.send(report(None)).await.unwrap();
    vm.request(CLUSTER_TYPE, &[], "").await;
    assert!(vm.next().await.is_some());
    // Read every later response (a stream whose proxy stops reading stalls), keeping their
    // types: none may answer a report.
    let types = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let mut rx = std::mem::replace(&mut vm.rx, Box::pin(futures::stream::pending()));
    let seen = types.clone();
    tokio::spawn(async move {
        while let Some(Ok(resp)) = rx.next().await {
            seen.lock().unwrap().push(resp.type_url);
        }
    });
    cp.reload().unwrap();
    assert!(
        vm_endpoints(&cp).is_empty(),
        "an entry before any report is not an endpoint"
    );
    let entries = cp.auto_registration().entries();
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert!(entries[0].checked && entries[0].health.is_none() && !entries[0].published);

    let settle = || async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        cp.reload().unwrap();
        vm_endpoints(&cp)
    };
    vm.tx.send(report(None)).await.unwrap();
    assert_eq!(
        settle().await,
        ["10.2.0.7 {\"http\": 18080} vm-sa".to_string()]
    );
    vm.tx
        .send(report(Some("connect 10.2.0.7:8080: refused")))
        .await
        .unwrap();
    assert!(settle().await.is_empty());
    let entries = cp.auto_registration().entries();
    assert_eq!(
        entries[0].health,
        Some((false, "connect 10.2.0.7:8080: refused".to_string()))
    );
    vm.tx.send(report(None)).await.unwrap();
    assert_eq!(settle().await.len(), 1);
    let types = types.lock().unwrap().clone();
    assert!(
        !types.iter().any(|t| t == HEALTH_INFO_TYPE),
        "a report was answered: {types:?}"
    );
}

/// Over the network only the group's own identity may register.
#[tokio::test]
async fn only_the_groups_identity_may_register_over_the_network() {
    use mesh_common::identity::Identity;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("mesh.yaml"), group_mesh()).unwrap();
    let cp = checked(dir.path());
    let server = cp.xds();
    let first = |ip: &str| {
        Ok(DiscoveryRequest {
            node: Some(registering_node(ip, "vm")),
            type_url: CLUSTER_TYPE.to_string(),
            ..Default::default()
        })
    };
    let id = |ns: &str, sa: &str| Some(Identity::new("cluster.local", ns, sa).unwrap());
    let group_sa = "spiffe://cluster.local/ns/vms/sa/vm-sa";
    for (caller, allowed, reason) in [
        (Caller::Peer(None), false, group_sa),
        (Caller::Peer(id("vms", "other-sa")), false, group_sa),
        // Refused before registration: the certificate's namespace is not the node's.
        (
            Caller::Peer(id("default", "vm-sa")),
            false,
            "names namespace vms",
        ),
        (Caller::Peer(id("vms", "vm-sa")), true, ""),
    ] {
        let (tx, rx) = mpsc::channel(1);
        tx.send(first("10.2.0.9")).await.unwrap();
        let mut out = server.open(
            Requests::Sotw(Box::pin(ReceiverStream::new(rx))),
            caller.clone(),
        );
        let got = tokio::time::timeout(Duration::from_secs(2), out.next())
            .await
            .unwrap()
            .unwrap();
        match got {
            Ok(_) => assert!(allowed, "{caller:?} registered"),
            Err(status) => {
                assert!(!allowed, "{caller:?} refused: {status}");
                assert_eq!(status.code(), tonic::Code::PermissionDenied);
                assert!(status.message().contains(reason), "{status}");
            }
        }
    }
    cp.reload().unwrap();
    assert_eq!(vm_endpoints(&cp).len(), 1);
}

/// The `istio.io/debug` types istioctl asks over xDS (`proxy-status --xds-address`): refused
/// to a caller without a verified identity, limited to its namespace for one of another
/// namespace, whole for the root namespace's; a config dump is what the proxy is sent.
#[tokio::test]
async fn debug_types_over_xds_need_an_identity_and_see_its_namespace() {
    use envoy_types::pb::envoy::service::status::v3::{ClientConfig, ConfigStatus};
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("mesh.yaml"), mesh(&["10.1.0.1"])).unwrap();
    let cp = checked(dir.path());
    let server = cp.xds();
    let mut proxy = Client::new(&server, "10.1.0.50");
    proxy
        .subscribe(&["outbound|80||web.shop.svc.cluster.local"])
        .await;
    let identity = |ns: &str| mesh_common::identity::Identity {
        trust_domain: "cluster.local".into(),
        namespace: ns.into(),
        service_account: "default".into(),
    };
    // istioctl's node and request.
    let ask = |caller: Caller, type_url: &'static str, names: &'static [&'static str]| {
        let server = server.clone();
        async move {
            let mut c = Client::of(&server, "10.1.0.99", caller);
            c.node.id = "sidecar~10.1.0.99~test-1.default~default.svc.cluster.local".into();
            c.request(type_url, names, "").await;
            tokio::time::timeout(Duration::from_secs(2), c.rx.next())
                .await
                .unwrap()
                .unwrap()
        }
    };
    let refused = ask(Caller::Peer(None), "istio.io/debug/syncz", &[])
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused:?}");

    let listed = |resp: DiscoveryResponse| -> Vec<ClientConfig> {
        assert_eq!(resp.type_url, "istio.io/debug/syncz");
        resp.resources
            .iter()
            .map(|a| ClientConfig::decode(a.value.as_slice()).unwrap())
            .collect()
    };
    let other = ask(
        Caller::Peer(Some(identity("default"))),
        "istio.io/debug/syncz",
        &[],
    )
    .await
    .unwrap();
    assert!(listed(other).is_empty(), "a proxy of shop shown to default");
    let root = ask(
        Caller::Peer(Some(identity("istio-system"))),
        "istio.io/debug/syncz",
        &[],
    )
    .await
    .unwrap();
    assert!(root.control_plane.unwrap().identifier.contains("\"ID\""));
    let all = listed(
        ask(
            Caller::Peer(Some(identity("istio-system"))),
            "istio.io/debug/syncz",
            &[],
        )
        .await
        .unwrap(),
    );
    // The debug callers themselves are not proxies.
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].node.as_ref().unwrap().id, "p-10.1.0.50.shop");
    for g in &all[0].generic_xds_configs {
        assert_eq!(
            g.config_status,
            ConfigStatus::Synced as i32,
            "{}",
            g.type_url
        );
    }
    // The proxy's own namespace, as its node id names it.
    let own = istiod_core::model::Proxy::from_node_id(&proxy.node.id)
        .unwrap()
        .namespace;
    let shop = listed(
        ask(
            Caller::Peer(Some(identity(&own))),
            "istio.io/debug/syncz",
            &[],
        )
        .await
        .unwrap(),
    );
    assert_eq!(shop.len(), 1);

    let dump = ask(
        Caller::InProcess,
        "istio.io/debug/config_dump",
        &["p-10.1.0.50.shop"],
    )
    .await
    .unwrap();
    assert_eq!(dump.resources.len(), 7);
    let clusters = envoy_types::pb::envoy::admin::v3::ClustersConfigDump::decode(
        dump.resources[1].value.as_slice(),
    )
    .unwrap();
    let generated = istiod_core::generators::cds::generate(
        &cp.snapshot(),
        &istiod_core::model::Proxy::from_node_id(&proxy.node.id).unwrap(),
    );
    assert_eq!(clusters.dynamic_active_clusters.len(), generated.len());
    let none = ask(
        Caller::Peer(Some(identity("default"))),
        "istio.io/debug/config_dump",
        &["p-10.1.0.50.shop"],
    )
    .await
    .unwrap();
    assert!(
        none.resources.is_empty(),
        "shop's config dump shown to default"
    );
}
