#![allow(clippy::unwrap_used)] // test code: a panic is the failure report
//! Istio's VM guide (https://istio.io/latest/docs/setup/install/virtual-machine/, single
//! network, auto-registration and health checks) with our package on the VM: a WorkloadGroup
//! with a readiness probe, `istioctl x workload entry configure --autoregister` writing the VM's
//! files, the package installed by apt on a Debian root and its unit's start script run in the
//! VM's network namespace on the cluster's network. The control plane registers the VM (a
//! WorkloadEntry with the group's labels), follows its health reports (the entry's `Healthy`
//! condition, and its endpoint only while healthy), and removes the entry after its grace period
//! once the VM stops; the VM restarted registers again. Pods call the VM's Service and the VM
//! calls theirs by name (the agent's DNS proxy), both over mTLS with the control plane's
//! certificates, and authorization applies to the VM's identity.
//!
//! What differs from the guide, and why: istiod listens on the node (no load balancer or
//! east-west gateway runs), so istioctl's `--ingressIP` is the node's address; the unit's
//! ExecStart runs in a container on the VM's root (no systemd in the test).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use cluster::Cluster;
use cluster::apply;
use cluster::bookinfo::{apply_text, curl, details_and_curl, pod_named, wait_pods_ready};
use cluster::istiod_core::{self, IstiodCore};
use cluster::node::NODE_IP;
use cluster::vm::{MeshVm, VmNetwork};
use kube::api::{Api, ApiResource, DynamicObject};

const MESH_NS: &str = "mesh";
const VM_NS: &str = "vm";

/// The control plane the VM joins.
enum Plane {
    Istiod,
    Core(IstiodCore),
}

/// The VM's auto-registered entry as the control plane shows it: istiod's WorkloadEntry object
/// (the `Healthy` condition of its status), or istiod-core's `/debug/autoregistrationz` (it
/// keeps auto-registered entries in memory).
#[derive(Debug, Clone)]
struct Entry {
    address: String,
    app: String,
    service_account: String,
    health_checked: bool,
    /// `True`/`False` and the message; `None` before the first report.
    health: Option<(String, String)>,
}

fn entry(c: &Cluster, plane: &Plane, name: &str) -> Option<Entry> {
    match plane {
        Plane::Istiod => {
            let ar = ApiResource {
                group: "networking.istio.io".into(),
                version: "v1".into(),
                api_version: "networking.istio.io/v1".into(),
                kind: "WorkloadEntry".into(),
                plural: "workloadentries".into(),
            };
            let api: Api<DynamicObject> = Api::namespaced_with(c.client.clone(), VM_NS, &ar);
            let e = serde_json::to_value(c.block_on(api.get_opt(name)).ok()??).ok()?;
            let health = e["status"]["conditions"]
                .as_array()
                .and_then(|cs| cs.iter().find(|c| c["type"] == "Healthy"))
                .map(|c| {
                    (
                        c["status"].as_str().unwrap_or_default().to_string(),
                        c["message"].as_str().unwrap_or_default().to_string(),
                    )
                });
            Some(Entry {
                address: e["spec"]["address"].as_str()?.to_string(),
                app: e["spec"]["labels"]["app"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                service_account: e["spec"]["serviceAccount"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                health_checked: e["metadata"]["annotations"]["proxy.istio.io/health-checks-enabled"]
                    == "true",
                health,
            })
        }
        Plane::Core(core) => {
            let all = core.debug(c, "/debug/autoregistrationz").ok()?;
            let e = all
                .as_array()?
                .iter()
                .find(|e| e["namespace"] == VM_NS && e["name"] == name)?
                .clone();
            let health = e["health"].as_array().map(|h| {
                (
                    if h[0] == true { "True" } else { "False" }.to_string(),
                    h[1].as_str().unwrap_or_default().to_string(),
                )
            });
            Some(Entry {
                address: e["address"].as_str()?.to_string(),
                app: e["labels"]["app"].as_str().unwrap_or_default().to_string(),
                service_account: e["service_account"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                health_checked: e["checked"] == true,
                health,
            })
        }
    }
}

/// The name istiod gives the VM's auto-registered entry: the group, the address, and the
/// network when it has one.
fn entry_name(vm: &MeshVm, network: &str) -> String {
    match network {
        "" => format!("vmapp-{}", vm.ip),
        net => format!("vmapp-{}-{net}", vm.ip),
    }
}

/// Waits until the VM's auto-registered entry `name` satisfies `want`; the entry and the seconds
/// it took.
fn wait_entry(
    c: &Cluster,
    plane: &Plane,
    vm: &MeshVm,
    name: &str,
    what: &str,
    limit: Duration,
    want: impl Fn(Option<&Entry>) -> bool,
) -> (Option<Entry>, f64) {
    let started = Instant::now();
    let mut last = None;
    let ok = harness::wait_until(limit, || {
        last = entry(c, plane, name);
        want(last.as_ref())
    });
    assert!(
        ok,
        "{what}: not within {limit:?}; entry {name}: {last:?}\n{}",
        vm.logs()
    );
    (last, started.elapsed().as_secs_f64())
}

/// Asks `get` (a GET's status and body) until the status is `want`, for up to 30 s; whether it
/// came, and the last answer.
fn wait_status(want: u16, mut get: impl FnMut() -> (u16, String)) -> (bool, (u16, String)) {
    let mut last = (0, String::new());
    let came = harness::wait_until(Duration::from_secs(30), || {
        last = get();
        last.0 == want
    });
    (came, last)
}

/// Applies a DENY at details for the VM's identity; waits until the VM's GET of `details` is
/// answered 403 and returns the last answer it got.
fn deny_the_vm_at_details(c: &Cluster, vm: &MeshVm, details: &str) -> (bool, (u16, String)) {
    let deny = format!(
        "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata:\n  name: deny-vm\n  namespace: {MESH_NS}\nspec:\n  selector:\n    matchLabels:\n      app: details\n  action: DENY\n  rules:\n  - from:\n    - source:\n        principals: [\"cluster.local/ns/{VM_NS}/sa/vmapp\"]\n"
    );
    apply_text(c, &deny, MESH_NS).unwrap();
    wait_status(403, || vm.curl(details).unwrap_or_default())
}

fn is_healthy(e: Option<&Entry>, status: &str) -> bool {
    e.and_then(|e| e.health.as_ref())
        .is_some_and(|(s, _)| s == status)
}

/// The objects of the guide: the VM's namespace, its service account, the WorkloadGroup (with
/// the probe the guide shows, faster), and a Service for the VM's app; the mesh namespace with
/// Bookinfo's details and Istio's curl sample.
fn apply_guide_objects(c: &Cluster, plane: &Plane, network: &str) -> String {
    apply_text(
        c,
        &format!("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {MESH_NS}\n  labels:\n    istio-injection: enabled\n"),
        MESH_NS,
    )
    .unwrap();
    let mut objects = details_and_curl().unwrap();
    if matches!(plane, Plane::Core(_)) {
        // No injector webhook runs beside istiod-core: Istio's injector offline.
        let yaml: Vec<String> = objects
            .iter()
            .map(|o| serde_yaml_ng::to_string(o).unwrap())
            .collect();
        let injected = istiod_core::kube_inject(c, &yaml.join("---\n")).unwrap();
        objects = apply::parse_objects(&injected).unwrap();
    }
    c.block_on(apply::apply_all(&c.client, &objects, Some(MESH_NS)))
        .unwrap();
    let group = format!(
        r#"apiVersion: networking.istio.io/v1
kind: WorkloadGroup
metadata:
  name: vmapp
  namespace: {VM_NS}
spec:
  metadata:
    labels:
      app: vmapp
  template:
    serviceAccount: vmapp
    network: "{network}"
  probe:
    periodSeconds: 1
    initialDelaySeconds: 1
    httpGet:
      port: 8080
      path: /ready
"#
    );
    apply_text(
        c,
        &format!(
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {VM_NS}\n---\napiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: vmapp\n  namespace: {VM_NS}\n---\napiVersion: v1\nkind: Service\nmetadata:\n  name: vmapp\n  namespace: {VM_NS}\n  labels:\n    app: vmapp\nspec:\n  ports:\n  - name: http\n    port: 8080\n    targetPort: 8080\n  selector:\n    app: vmapp\n---\n{group}"
        ),
        VM_NS,
    )
    .unwrap();
    let file = c.dir.join("workloadgroup.yaml");
    std::fs::write(&file, &group).unwrap();
    file.display().to_string()
}

/// The guide end to end against whichever control plane `c` runs.
fn the_guide(c: &Cluster, plane: &Plane, root: &std::path::Path) {
    let group_file = apply_guide_objects(c, plane, "");
    wait_pods_ready(c, MESH_NS, 2, Duration::from_secs(120)).unwrap();
    let mut vm = MeshVm::create(c, "vm", root, VmNetwork::Pods).unwrap();
    let files = vm
        .configure(
            c,
            &group_file,
            &["--clusterID", "Kubernetes", "--ingressIP", NODE_IP],
        )
        .unwrap();
    assert!(
        files.mesh.contains("readinessProbe") && files.mesh.contains("AUTO_REGISTER_GROUP"),
        "istioctl's mesh.yaml:\n{}",
        files.mesh
    );
    assert!(
        files.hosts.contains("istiod.istio-system.svc"),
        "{}",
        files.hosts
    );

    eprintln!(
        "STEP istioctl wrote cluster.env:\n{}\nmesh.yaml:\n{}\nhosts: {}",
        files.cluster_env,
        files.mesh,
        files.hosts.trim()
    );

    // First with an expired token (istioctl's, an hour and more after it was made): the
    // agent names it, file and age, beside the control plane's refusal.
    let machine = vm.machine();
    let token = std::fs::read_to_string(machine.token_file()).unwrap();
    std::fs::write(
        machine.token_file(),
        harness::vm::expired_token(VM_NS, "vmapp"),
    )
    .unwrap();
    machine.start().unwrap();
    let named = harness::wait_until(Duration::from_secs(30), || {
        vm.logs()
            .contains("the token in ./var/run/secrets/tokens/istio-token expired")
    });
    assert!(named, "the expired token is not named:\n{}", vm.logs());
    eprintln!("STEP an expired token: the agent names the file and its age");
    machine.stop(5);
    machine.clear_logs();
    std::fs::write(machine.token_file(), &token).unwrap();

    // Then with istiod out of reach (its hosts line names an address where nothing is): the
    // agent names what it cannot reach and retries; the VM's captured traffic meanwhile goes
    // nowhere, never around the sidecar (details would answer a plaintext request).
    let hosts = vm.machine().root.join("etc/hosts");
    let good = std::fs::read_to_string(&hosts).unwrap();
    let nowhere = c.kubelet.reserve_address().unwrap();
    std::fs::write(
        &hosts,
        good.replace(&format!("{NODE_IP} istiod"), &format!("{nowhere} istiod")),
    )
    .unwrap();
    vm.machine().restart().unwrap();
    let details_pod = pod_named(c, MESH_NS, "details-").unwrap();
    let details_ip = c.kubelet.pod(MESH_NS, &details_pod).unwrap().ip.clone();
    // The start script removes the last run's capture and applies it again before it starts
    // the agent (as Istio's does): the agent's first line says capture is in place.
    let captured = harness::wait_until(Duration::from_secs(30), || {
        vm.logs().contains("starting pilot-agent") && vm.capture_rules().contains("ISTIO_OUTPUT")
    });
    assert!(captured, "no capture on the VM\n{}", vm.logs());
    let direct = format!("http://{details_ip}:9080/details/0");
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(3) {
        let got = vm.curl(&direct).unwrap();
        assert_ne!(got.0, 200, "the VM's traffic bypassed its sidecar: {got:?}");
    }
    let named = harness::wait_until(Duration::from_secs(30), || {
        vm.logs().lines().any(|l| {
            l.contains("workload certificate request failed")
                && l.contains("istiod.istio-system.svc:15012")
        })
    });
    assert!(named, "the unreachable istiod is not named:\n{}", vm.logs());
    eprintln!(
        "STEP istiod unreachable: the agent names it and retries; the VM's requests fail, none bypasses the sidecar"
    );
    vm.machine().stop(5);
    vm.machine().clear_logs();
    std::fs::write(&hosts, &good).unwrap();

    // The VM starts with its app down: registered, unhealthy.
    vm.machine().restart().unwrap();
    let name = entry_name(&vm, "");
    let (entry, took) = wait_entry(
        c,
        plane,
        &vm,
        &name,
        "the VM registers, unhealthy while its app is down",
        Duration::from_secs(90),
        |e| is_healthy(e, "False"),
    );
    let entry = entry.unwrap();
    assert_eq!(entry.address, vm.ip, "{entry:?}");
    assert_eq!(entry.app, "vmapp", "{entry:?}");
    assert_eq!(entry.service_account, "vmapp", "{entry:?}");
    assert!(entry.health_checked, "{entry:?}");
    let message = &entry.health.as_ref().unwrap().1;
    assert!(message.contains("8080"), "the probe's reason: {entry:?}");
    eprintln!(
        "STEP VM registered in {took:.1} s as vmapp-{}, Healthy=False ({message})",
        vm.ip
    );
    let url = format!("http://vmapp.{VM_NS}:8080/from-pod");
    let (code, body) = curl(c, MESH_NS, &url, &[]).unwrap();
    assert_eq!(code, 503, "an unhealthy VM is no endpoint: {body}");

    // The app answers: healthy, and pods reach it over mTLS.
    vm.start_app(8080).unwrap();
    let (_, took) = wait_entry(
        c,
        plane,
        &vm,
        &name,
        "the VM turns healthy once its app answers the probe",
        Duration::from_secs(30),
        |e| is_healthy(e, "True"),
    );
    eprintln!("STEP the probe passes: Healthy=True in {took:.1} s");
    let from_pod = || curl(c, MESH_NS, &url, &[]).unwrap_or_default();
    let (reached, last) = wait_status(200, from_pod);
    assert!(reached, "curl pod -> VM: {last:?}\n{}", vm.logs());
    let xfcc = last
        .1
        .lines()
        .find(|l| {
            l.to_ascii_lowercase()
                .starts_with("x-forwarded-client-cert:")
        })
        .unwrap_or_default()
        .to_string();
    assert!(
        xfcc.contains(&format!("By=spiffe://cluster.local/ns/{VM_NS}/sa/vmapp"))
            && xfcc.contains(&format!("URI=spiffe://cluster.local/ns/{MESH_NS}/sa/curl")),
        "not mTLS with both identities: {:?}",
        last.1
    );
    eprintln!("STEP pod -> VM over mTLS ({xfcc})");

    // The VM calls the mesh by name: only the agent's DNS proxy knows it.
    let details = format!("http://details.{MESH_NS}.svc.cluster.local:9080/details/0");
    let (reached, last) = wait_status(200, || vm.curl(&details).unwrap_or_default());
    assert!(reached, "VM -> details by name: {last:?}\n{}", vm.logs());
    eprintln!("STEP VM -> details by name through the DNS proxy: 200");

    // Authorization on the VM's identity: a DENY for it, then gone.
    let (denied, last) = deny_the_vm_at_details(c, &vm, &details);
    assert!(denied, "a DENY for the VM's identity: {last:?}");
    let pod_call = curl(
        c,
        MESH_NS,
        &format!("http://details.{MESH_NS}:9080/details/0"),
        &[],
    )
    .unwrap();
    assert_eq!(pod_call.0, 200, "the DENY is for the VM only: {pod_call:?}");
    eprintln!(
        "STEP a DENY for spiffe://cluster.local/ns/{VM_NS}/sa/vmapp answers the VM 403, the pod 200"
    );

    // The app stops answering: unhealthy, no endpoint; back: healthy.
    vm.stop_app();
    let (entry, took) = wait_entry(
        c,
        plane,
        &vm,
        &name,
        "the VM turns unhealthy when its app stops",
        Duration::from_secs(30),
        |e| is_healthy(e, "False"),
    );
    let (down, last) = wait_status(503, from_pod);
    assert!(down, "pods still sent to the unhealthy VM: {last:?}");
    eprintln!(
        "STEP app down: Healthy=False in {took:.1} s ({}), pods get 503",
        entry.unwrap().health.unwrap().1
    );
    vm.start_app(8080).unwrap();
    wait_entry(
        c,
        plane,
        &vm,
        &name,
        "healthy again",
        Duration::from_secs(30),
        |e| is_healthy(e, "True"),
    );
    let (up, last) = wait_status(200, from_pod);
    assert!(
        up,
        "the VM is healthy again but pods do not reach it: {last:?}"
    );

    // The VM stops: its entry goes after the grace period; started again, it registers again.
    let stopped = Instant::now();
    vm.machine().stop(10);
    let (_, took) = wait_entry(
        c,
        plane,
        &vm,
        &name,
        "the stopped VM's entry is removed",
        Duration::from_secs(60),
        |e| e.is_none(),
    );
    eprintln!(
        "STEP VM stopped: its WorkloadEntry removed {:.1} s after the stop ({took:.1} s of waiting)",
        stopped.elapsed().as_secs_f64()
    );
    vm.machine().restart().unwrap();
    let (_, took) = wait_entry(
        c,
        plane,
        &vm,
        &name,
        "the restarted VM registers again, healthy",
        Duration::from_secs(90),
        |e| is_healthy(e, "True"),
    );
    let (back, last) = wait_status(200, from_pod);
    assert!(
        back,
        "pods -> the re-registered VM: {last:?}\n{}",
        vm.logs()
    );
    eprintln!("STEP VM restarted: registered again and healthy in {took:.1} s, pods reach it");
}

/// A guide test's set-up: the root and Envoy checks, the VM's root (made first: apt needs the
/// host's network), the cluster with Istio's istiod or istiod-core installed with `values`.
/// `None` when the test cannot run here (the harness says why).
fn set_up(test: &str, core: bool, values: &[&str]) -> Option<(Cluster, Plane, PathBuf)> {
    if !harness::require_root(test) || !harness::require_envoy(test) {
        return None;
    }
    let root = MeshVm::prepare_root().unwrap();
    let mut c = Cluster::start().expect("start the cluster");
    let plane = if core {
        Plane::Core(
            istiod_core::install(&mut c, values).expect("install Istio's config and istiod-core"),
        )
    } else {
        cluster::istio::install(&mut c, values).expect("install Istio");
        Plane::Istiod
    };
    Some((c, plane, root))
}

#[test]
fn a_vm_joins_istiods_mesh_by_istios_vm_guide() {
    if let Some((c, plane, root)) = set_up("a_vm_joins_istiods_mesh_by_istios_vm_guide", false, &[])
    {
        the_guide(&c, &plane, &root);
    }
}

#[test]
fn a_vm_joins_istiod_cores_mesh_by_istios_vm_guide() {
    if let Some((c, plane, root)) =
        set_up("a_vm_joins_istiod_cores_mesh_by_istios_vm_guide", true, &[])
    {
        the_guide(&c, &plane, &root);
    }
}

/// Istio's multi-network VM guide: istiod on network `kube-network` (mesh `mesh1`, cluster
/// `cluster1`), the east-west gateway `samples/multicluster/gen-eastwest-gateway.sh` describes,
/// rendered by istioctl and run from our proxy image (Istio's `gateway` injection template, our
/// `pilot-agent proxy router`), istiod and the services exposed through it
/// (`expose-istiod.yaml`, `expose-services.yaml`), and the VM on network `vm-network`, which
/// reaches the cluster only at the gateway's address. The VM gets its certificate and config
/// from istiod through the gateway's 15012, registers (its entry named after its network),
/// reports its health, and calls details by name through the gateway's 15443
/// (AUTO_PASSTHROUGH, mTLS end to end: a DENY on its identity applies at details).
const MULTI_NETWORK: [&str; 3] = [
    "values.global.meshID=mesh1",
    "values.global.multiCluster.clusterName=cluster1",
    "values.global.network=kube-network",
];

#[test]
fn a_vm_on_another_network_joins_through_the_east_west_gateway() {
    if let Some((c, plane, root)) = set_up(
        "a_vm_on_another_network_joins_through_the_east_west_gateway",
        false,
        &MULTI_NETWORK,
    ) {
        the_multi_network_guide(&c, &plane, &root);
    }
}

#[test]
fn a_vm_on_another_network_joins_istiod_core_through_the_east_west_gateway() {
    if let Some((c, plane, root)) = set_up(
        "a_vm_on_another_network_joins_istiod_core_through_the_east_west_gateway",
        true,
        &MULTI_NETWORK,
    ) {
        the_multi_network_guide(&c, &plane, &root);
    }
}

/// The multi-network guide against whichever control plane `c` runs.
fn the_multi_network_guide(c: &Cluster, plane: &Plane, root: &std::path::Path) {
    let gateway = east_west_gateway(c, plane);
    let group_file = apply_guide_objects(c, plane, "vm-network");
    wait_pods_ready(c, MESH_NS, 2, Duration::from_secs(120)).unwrap();
    let mut vm = MeshVm::create(c, "vm", root, VmNetwork::Own { gateway: &gateway }).unwrap();
    // istioctl finds the gateway's address itself (its Service's load balancer address).
    let files = vm
        .configure(c, &group_file, &["--clusterID", "cluster1"])
        .unwrap();
    assert!(
        files
            .hosts
            .contains(&format!("{gateway} istiod.istio-system.svc")),
        "istioctl's hosts: {:?}",
        files.hosts
    );
    assert!(
        files
            .cluster_env
            .contains("ISTIO_META_NETWORK='vm-network'"),
        "{}",
        files.cluster_env
    );
    vm.machine().start().unwrap();
    vm.start_app(8080).unwrap();
    let name = entry_name(&vm, "vm-network");
    wait_entry(
        c,
        plane,
        &vm,
        &name,
        "the VM on vm-network registers, healthy",
        Duration::from_secs(90),
        |e| is_healthy(e, "True"),
    );
    eprintln!(
        "STEP VM on vm-network: certificate and config through the gateway's 15012, registered as {name}, healthy"
    );

    let details = format!("http://details.{MESH_NS}.svc.cluster.local:9080/details/0");
    let (reached, got) = wait_status(200, || vm.curl(&details).unwrap_or_default());
    assert!(
        reached,
        "VM -> details through the gateway: {got:?}\n{}",
        vm.logs()
    );
    let gw_pod = pod_named(c, "istio-system", "istio-eastwestgateway-").unwrap();
    // The gateway's connections to details' pod (its SNI cluster's hosts).
    let through = cluster::bookinfo::host_connections(
        c,
        "istio-system",
        &gw_pod,
        "details.mesh.svc.cluster.local",
    )
    .unwrap();
    assert!(
        through >= 1,
        "the gateway did not carry it; its /clusters:\n{}",
        cluster::bookinfo::pod_local(
            c,
            "istio-system",
            &gw_pod,
            "http://127.0.0.1:15000/clusters"
        )
        .unwrap_or_default()
    );
    eprintln!(
        "STEP VM -> details by name, through the east-west gateway's 15443: 200 ({through} gateway connections to details)"
    );

    let (denied, got) = deny_the_vm_at_details(c, &vm, &details);
    assert!(
        denied,
        "a DENY for the VM's identity across networks: {got:?}"
    );
    eprintln!(
        "STEP a DENY on the VM's identity applies at details across the gateway (mTLS end to end)"
    );
}

/// The east-west gateway of Istio's multi-network guide, running; its address. The cluster has
/// no load balancer: the gateway's Service gets its pod's address as its load balancer address
/// (what a cloud's would publish). istiod runs on the node, outside any pod: its Service gets an
/// EndpointSlice naming the node, so the gateway can pass 15012 through to it.
fn east_west_gateway(c: &Cluster, plane: &Plane) -> String {
    use k8s_openapi::api::core::v1::{Namespace, Service};
    use kube::api::{Patch, PatchParams};
    let samples = harness::istio::istio_home().join("samples/multicluster");
    let namespaces: Api<Namespace> = Api::all(c.client.clone());
    let label =
        serde_json::json!({"metadata": {"labels": {"topology.istio.io/network": "kube-network"}}});
    c.block_on(namespaces.patch(
        "istio-system",
        &PatchParams::default(),
        &Patch::Merge(&label),
    ))
    .unwrap();
    let slice = format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: istiod-on-the-node\n  namespace: istio-system\n  labels:\n    kubernetes.io/service-name: istiod\n    endpointslice.kubernetes.io/managed-by: vm-guide-test\naddressType: IPv4\nendpoints:\n- addresses: [\"{NODE_IP}\"]\n  conditions: {{ready: true}}\nports:\n- {{name: grpc-xds, port: 15010, protocol: TCP}}\n- {{name: https-dns, port: 15012, protocol: TCP}}\n- {{name: https-webhook, port: 15017, protocol: TCP}}\n- {{name: http-monitoring, port: 15014, protocol: TCP}}\n"
    );
    apply_text(c, &slice, "istio-system").unwrap();

    let iop = std::process::Command::new("bash")
        .arg(samples.join("gen-eastwest-gateway.sh"))
        .args(["--network", "kube-network"])
        .output()
        .unwrap();
    assert!(iop.status.success(), "{iop:?}");
    let iop_file = c.dir.join("eastwest-iop.yaml");
    std::fs::write(&iop_file, &iop.stdout).unwrap();
    let mut args: Vec<String> = cluster::istio::manifest_args(&[]);
    args.retain(|a| a != "profile=minimal");
    let pos = args.iter().position(|a| a == "--set").unwrap();
    args.remove(pos);
    args.extend(["-f".into(), iop_file.display().to_string()]);
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let rendered = cluster::istioctl::ok(c, &argv).unwrap();
    // istiod injects the gateway's pod (Istio's `gateway` template); beside istiod-core,
    // Istio's injector runs offline.
    let rendered = match plane {
        Plane::Istiod => rendered,
        Plane::Core(_) => istiod_core::kube_inject(c, &rendered).unwrap(),
    };
    let objects: Vec<serde_json::Value> = apply::parse_objects(&rendered)
        .unwrap()
        .into_iter()
        .filter(|o| o["kind"] != "HorizontalPodAutoscaler")
        .collect();
    c.block_on(apply::apply_all(&c.client, &objects, Some("istio-system")))
        .unwrap();
    cluster::bookinfo::wait_named_ready(
        c,
        "istio-system",
        "istio-eastwestgateway-",
        Duration::from_secs(120),
    )
    .unwrap();
    let pod = pod_named(c, "istio-system", "istio-eastwestgateway-").unwrap();
    let ip = c.kubelet.pod("istio-system", &pod).unwrap().ip.clone();
    let services: Api<Service> = Api::namespaced(c.client.clone(), "istio-system");
    let status = serde_json::json!({"status": {"loadBalancer": {"ingress": [{"ip": ip}]}}});
    c.block_on(services.patch_status(
        "istio-eastwestgateway",
        &PatchParams::default(),
        &Patch::Merge(&status),
    ))
    .unwrap();
    for f in ["expose-istiod.yaml", "expose-services.yaml"] {
        let text = std::fs::read_to_string(samples.join(f)).unwrap();
        apply_text(c, &text, "istio-system").unwrap();
    }
    eprintln!("STEP east-west gateway {pod} ready at {ip}, istiod and *.local exposed through it");
    ip
}
