#![allow(clippy::unwrap_used)] // test code: a panic is the failure report
//! The VM package end to end: `istio-sidecar.deb` (built by `./scripts/deb.sh --debug`, which
//! scripts/test.sh runs) installed by apt into a fresh Debian root made by mmdebstrap, the files of
//! Istio's VM guide put in place (cluster.env, mesh config, root certificate, token, the
//! istiod line in /etc/hosts), and its start script run as the unit's ExecStart in a container
//! on that root inside the VM's network namespace. A client reaches the VM's app through the
//! VM's Envoy (inbound capture), the VM's app reaches a mesh-external service by its VIP
//! (outbound capture, only Envoy knows the VIP), and purging the package removes the capture
//! rules, the files and the istio-proxy user. The control plane is `istiod-core serve` with its
//! CA, on 15012 over TLS.

use std::path::Path;
use std::time::Duration;

use harness::vm::{GuideFiles, Vm, deb_path, debian_root};
use harness::{Network, TestCa, binary, cannot_run, require_root, wait_until};

const NS: &str = "vmns";
const SA: &str = "vmsa";
const EXT_VIP: &str = "10.234.0.90";
const ISTIOD_IP: &str = "10.233.0.2";
const VM_IP: &str = "10.233.0.3";

fn mesh_config(dir: &Path, ext_ip: &str) {
    std::fs::create_dir_all(dir).unwrap();
    let yaml = format!(
        r#"kind: ServiceEntry
metadata: {{name: ext, namespace: {NS}}}
spec:
  hosts: [ext.example.com]
  addresses: [{EXT_VIP}]
  location: MESH_EXTERNAL
  resolution: STATIC
  ports: [{{number: 8000, name: http, protocol: HTTP}}]
  endpoints: [{{address: {ext_ip}}}]
---
kind: ServiceEntry
metadata: {{name: vmapp, namespace: {NS}}}
spec:
  hosts: [vmapp.{NS}.svc.cluster.local]
  addresses: [10.234.0.91]
  ports: [{{number: 8000, name: http, protocol: HTTP}}]
  workloadSelector: {{labels: {{app: vmapp}}}}
---
kind: WorkloadEntry
metadata: {{name: vmapp, namespace: {NS}}}
spec: {{address: {VM_IP}, labels: {{app: vmapp}}, serviceAccount: {SA}}}
"#
    );
    std::fs::write(dir.join("mesh.yaml"), yaml).unwrap();
}

/// The files `istioctl x workload entry configure` writes for this VM (the control plane here is
/// istiod-core without Kubernetes, so they are written by hand as istioctl would).
fn guide_files(ca: &TestCa) -> GuideFiles {
    GuideFiles {
        cluster_env: format!(
            "CANONICAL_REVISION='latest'\nCANONICAL_SERVICE='vmapp'\nISTIO_INBOUND_PORTS='8000'\n\
             ISTIO_LOCAL_EXCLUDE_PORTS='22,15090,15021,15020'\n\
             ISTIO_METAJSON_LABELS='{{\"app\":\"vmapp\",\"service.istio.io/canonical-name\":\"vmapp\",\"service.istio.io/canonical-revision\":\"latest\"}}'\n\
             ISTIO_META_CLUSTER_ID='Kubernetes'\nISTIO_META_DNS_CAPTURE='true'\n\
             ISTIO_META_MESH_ID='cluster.local'\nISTIO_META_NETWORK=''\n\
             ISTIO_META_WORKLOAD_NAME='vmapp'\nISTIO_NAMESPACE='{NS}'\nISTIO_SERVICE='vmapp.{NS}'\n\
             ISTIO_SERVICE_CIDR='*'\nISTIO_SVC_IP='{VM_IP}'\nPOD_NAMESPACE='{NS}'\n\
             SERVICE_ACCOUNT='{SA}'\nTRUST_DOMAIN='cluster.local'\n"
        ),
        mesh: "defaultConfig:\n  discoveryAddress: istiod.istio-system.svc:15012\n  meshId: cluster.local\n  \
         terminationDrainDuration: 1s\n  proxyMetadata:\n    CANONICAL_REVISION: latest\n    \
         CANONICAL_SERVICE: vmapp\n    ISTIO_META_CLUSTER_ID: Kubernetes\n    ISTIO_META_DNS_CAPTURE: \"true\"\n    \
         ISTIO_META_MESH_ID: cluster.local\n    ISTIO_META_WORKLOAD_NAME: vmapp\n    POD_NAMESPACE: vmns\n    \
         SERVICE_ACCOUNT: vmsa\n    TRUST_DOMAIN: cluster.local\n"
            .into(),
        root_cert: std::fs::read_to_string(ca.root_cert()).unwrap(),
        token: ca.token(NS, SA).unwrap(),
        hosts: format!("{ISTIOD_IP} istiod.istio-system.svc\n"),
    }
}

fn capture_rules(net: &Network, vm: usize) -> String {
    let out = net.pods[vm]
        .exec(&["sh", "-c", "iptables-nft-save; iptables-legacy-save"])
        .unwrap();
    String::from_utf8_lossy(&out.stdout).to_string()
}

#[test]
fn vm_package_installs_captures_both_ways_and_purges_cleanly() {
    let test = "vm_package_installs_captures_both_ways_and_purges_cleanly";
    if !require_root(test) {
        return;
    }
    if !deb_path().exists() {
        cannot_run(&format!(
            "{test}: no {} (build it with ./scripts/deb.sh --debug)",
            deb_path().display()
        ));
        return;
    }
    let mut net = Network::new().unwrap();
    let cp = net.add_pod("istiod", 2).unwrap();
    let vm = net.add_pod("vm", 3).unwrap();
    let ext = net.add_pod("ext", 4).unwrap();
    let client = net.add_pod("client", 5).unwrap();
    let config = net.dir().join("mesh");
    mesh_config(&config, &net.pods[ext].ip.to_string());
    let ca = TestCa::new(&net.dir().join("ca")).unwrap();
    ca.spawn_control_plane(&mut net.pods[cp], &config, "0.0.0.0:15012", &[])
        .unwrap();
    let probe = binary("netprobe");
    let probe = probe.to_str().unwrap();
    net.pods[ext]
        .spawn("ext", 1000, 1000, &[], &[probe, "http-echo", "8000"])
        .unwrap();

    let root = net.dir().join("vm-root");
    debian_root(&root).unwrap();
    assert!(root.join("lib/systemd/system/istio.service").exists());
    let passwd = std::fs::read_to_string(root.join("etc/passwd")).unwrap();
    assert!(passwd.contains("istio-proxy:x:1337:1337:"), "{passwd}");
    assert!(
        wait_until(Duration::from_secs(30), || ca.root_cert().exists()),
        "no root from the control plane\n{}",
        net.logs()
    );
    let machine = Vm::new(&root, &net.pods[vm].ns, &net.dir().join("vm-tokens"));
    machine.place(&guide_files(&ca)).unwrap();

    // The unit's ExecStart, in the VM's network namespace.
    machine.start().unwrap();
    let ready = net.pods[vm].wait_http_ok(
        "http://127.0.0.1:15021/healthz/ready",
        Duration::from_secs(60),
    );
    assert!(
        ready.is_ok(),
        "{ready:?}\n{}\n{}",
        machine.logs(),
        net.logs()
    );
    assert!(capture_rules(&net, vm).contains("ISTIO_INBOUND"));
    net.pods[vm]
        .spawn("app", 1000, 1000, &[], &[probe, "http-echo", "8000"])
        .unwrap();

    // Inbound: the client's plain request reaches the app through the VM's Envoy, which adds
    // the request id.
    let url = format!("http://{VM_IP}:8000/in");
    let mut last = (0, String::new());
    let inbound = wait_until(Duration::from_secs(20), || {
        last = net.pods[client].http_get(1000, &url).unwrap();
        last.0 == 200
    });
    assert!(
        inbound && last.1.to_ascii_lowercase().contains("x-request-id"),
        "{last:?}\n{}\n{}",
        machine.logs(),
        net.logs()
    );
    // Outbound: the VM's app reaches the external service by a VIP only its Envoy knows.
    let out = net.pods[vm]
        .http_get(1000, &format!("http://{EXT_VIP}:8000/out"))
        .unwrap();
    assert!(
        out.0 == 200 && out.1.contains("GET /out"),
        "{out:?}\n{}\n{}",
        machine.logs(),
        net.logs()
    );

    // Stop the proxy, then purge: the capture rules, the files and the user go.
    machine.stop(5);
    let purged = machine.run(&["dpkg", "--purge", "istio-sidecar"]).unwrap();
    assert!(purged.status.success(), "{purged:?}");
    let rules = capture_rules(&net, vm);
    assert!(!rules.contains("ISTIO"), "capture rules left:\n{rules}");
    for gone in [
        "usr/local/bin/pilot-agent",
        "usr/local/bin/envoy",
        "usr/local/bin/istio-start.sh",
        "lib/systemd/system/istio.service",
        "var/lib/istio",
        "etc/certs",
    ] {
        assert!(!root.join(gone).exists(), "{gone} left after purge");
    }
    let passwd = std::fs::read_to_string(root.join("etc/passwd")).unwrap();
    assert!(!passwd.contains("istio-proxy"), "{passwd}");
}
