//! The control plane and the node: certificates, etcd, kube-apiserver, kube-controller-manager,
//! the node's network namespace and its Node object, and a typed client.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use k8s_openapi::api::core::v1::{Namespace, Node};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};

use harness::Proc;

use crate::installs::kube_bin;
use crate::kubelet::Kubelet;
pub use crate::node::*;

static NEXT: AtomicU32 = AtomicU32::new(0);

/// A running cluster. Dropping it stops the kubelet's pods, then istiod and the control plane
/// (last started first), and deletes the namespaces; the directory with every component's log
/// is kept when the thread is panicking (a failed test) and its path printed.
pub struct Cluster {
    pub id: String,
    /// The node's network namespace (the host network of every component).
    pub node_ns: String,
    /// Certificates, kubeconfig, data and logs of this cluster.
    pub dir: PathBuf,
    pub kubeconfig: PathBuf,
    pub client: kube::Client,
    pub kubelet: Kubelet,
    components: Vec<Proc>,
    /// kube-apiserver's command line, for `restart_apiserver`.
    apiserver_args: Vec<String>,
    // Last, so the client and kubelet tasks are gone before the runtime stops.
    rt: tokio::runtime::Runtime,
}

impl Cluster {
    /// Starts etcd, kube-apiserver and kube-controller-manager in a new node namespace, creates
    /// the Node (Ready, topology labels, kubelet version `KUBE_VERSION`) and starts the test
    /// kubelet for it. The calling thread joins the node's network namespace (tests spawn
    /// processes that must reach the API server on its loopback).
    pub fn start() -> Result<Cluster> {
        harness::sweep_stale();
        let etcd = kube_bin("etcd")?;
        let apiserver = kube_bin("kube-apiserver")?;
        let kcm = kube_bin("kube-controller-manager")?;
        let id = format!(
            "{}-{}-k{}",
            harness::PREFIX,
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let dir = std::env::temp_dir().join(&id);
        fs::create_dir_all(dir.join("logs"))?;
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755))?;
        let node_ns = format!("{id}-node");
        harness::run("ip", &["netns", "add", &node_ns])?;
        for args in [
            vec!["link", "set", "lo", "up"],
            vec!["link", "add", "cbr0", "type", "bridge"],
            vec!["addr", "add", "10.244.0.1/24", "dev", "cbr0"],
            vec!["link", "set", "cbr0", "up"],
            // Service addresses go nowhere from the node: only sidecars route them.
            vec!["route", "add", "unreachable", SERVICE_CIDR],
        ] {
            let mut full = vec!["-n", node_ns.as_str()];
            full.extend(args);
            harness::run("ip", &full)?;
        }
        enter_netns(&node_ns)?;
        let started = Instant::now();
        let pki = Pki::write(&dir)?;
        let kubeconfig = dir.join("kubeconfig");
        fs::write(&kubeconfig, pki.kubeconfig("https://127.0.0.1:6443"))?;

        let mut components = Vec::new();
        let s = |v: &[&str]| v.iter().map(|a| a.to_string()).collect::<Vec<_>>();
        let d = |p: &str| dir.join(p).display().to_string();
        components.push(Proc::start(
            "etcd",
            &s(&[
                &etcd.display().to_string(),
                "--data-dir",
                &d("etcd"),
                "--listen-client-urls=http://127.0.0.1:2379",
                "--advertise-client-urls=http://127.0.0.1:2379",
                "--listen-peer-urls=http://127.0.0.1:2380",
            ]),
            &[],
            &dir,
            &dir.join("logs/etcd.log"),
        )?);
        let apiserver_args = s(&[
            &apiserver.display().to_string(),
            "--etcd-servers=http://127.0.0.1:2379",
            "--bind-address=127.0.0.1",
            "--secure-port=6443",
            &format!("--advertise-address={NODE_IP}"),
            "--endpoint-reconciler-type=none",
            &format!("--tls-cert-file={}", d("pki/apiserver.crt")),
            &format!("--tls-private-key-file={}", d("pki/apiserver.key")),
            &format!("--client-ca-file={}", d("pki/ca.crt")),
            &format!("--service-account-key-file={}", d("pki/sa.pub")),
            &format!("--service-account-signing-key-file={}", d("pki/sa.key")),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            "--api-audiences=https://kubernetes.default.svc.cluster.local,istio-ca",
            "--authorization-mode=Node,RBAC",
            &format!("--service-cluster-ip-range={SERVICE_CIDR}"),
            "--allow-privileged=true",
            // exec and logs: the kubelet at the Node's InternalIP, its certificate checked
            // against the cluster's CA, the API server presenting a client certificate.
            "--kubelet-preferred-address-types=InternalIP",
            &format!("--kubelet-certificate-authority={}", d("pki/ca.crt")),
            &format!(
                "--kubelet-client-certificate={}",
                d("pki/apiserver-kubelet-client.crt")
            ),
            &format!(
                "--kubelet-client-key={}",
                d("pki/apiserver-kubelet-client.key")
            ),
        ]);
        components.push(Proc::start(
            "kube-apiserver",
            &apiserver_args,
            &[],
            &dir,
            &dir.join("logs/kube-apiserver.log"),
        )?);

        let rt = node_runtime(&node_ns)?;
        let client = rt.block_on(client_for(&kubeconfig))?;
        let ready = rt.block_on(async {
            let deadline = Instant::now() + Duration::from_secs(60);
            let ns: Api<Namespace> = Api::all(client.clone());
            while Instant::now() < deadline {
                if ns.get_opt("default").await.is_ok_and(|n| n.is_some()) {
                    return true;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            false
        });
        if !ready {
            let logs = components[1].logs();
            bail!(
                "kube-apiserver not ready in 60 s; its log ends:\n{}",
                harness::tail(&logs, 30)
            );
        }
        components.push(Proc::start(
            "kube-controller-manager",
            &s(&[
                &kcm.display().to_string(),
                &format!("--kubeconfig={}", kubeconfig.display()),
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                &format!("--root-ca-file={}", d("pki/ca.crt")),
                &format!("--service-account-private-key-file={}", d("pki/sa.key")),
                "--use-service-account-credentials=false",
                // No node IPAM (the kubelet owns its pod range) and no node lifecycle (no
                // heartbeats to watch): every other controller runs.
                "--controllers=*,-nodeipam,-nodelifecycle",
            ]),
            &[],
            &dir,
            &dir.join("logs/kube-controller-manager.log"),
        )?);
        rt.block_on(create_node(&client))?;
        let kubelet = Kubelet::start(rt.handle(), client.clone(), &dir, &id)?;
        eprintln!(
            "cluster {id}: API server and node ready in {:.1} s (logs in {})",
            started.elapsed().as_secs_f64(),
            dir.join("logs").display()
        );
        Ok(Cluster {
            id,
            node_ns,
            dir,
            kubeconfig,
            client,
            kubelet,
            components,
            apiserver_args,
            rt,
        })
    }

    /// Stops kube-apiserver (SIGTERM), leaves it down for `down`, starts it again with the same
    /// command line and waits until it answers: every client's watches break meanwhile.
    pub fn restart_apiserver(&mut self, down: Duration) -> Result<()> {
        let log = self.logs_dir().join("kube-apiserver.log");
        if let Some(old) = self.stop_component("kube-apiserver", Duration::from_secs(10)) {
            let _ = fs::copy(
                &old.log,
                self.logs_dir().join("kube-apiserver.previous.log"),
            );
        }
        std::thread::sleep(down);
        let c = Proc::start("kube-apiserver", &self.apiserver_args, &[], &self.dir, &log)?;
        self.components.insert(1, c);
        let client = self.client.clone();
        let ready = self.block_on(async {
            let deadline = Instant::now() + Duration::from_secs(60);
            let ns: Api<Namespace> = Api::all(client);
            while Instant::now() < deadline {
                if ns.get_opt("default").await.is_ok_and(|n| n.is_some()) {
                    return true;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            false
        });
        if !ready {
            bail!("kube-apiserver not ready in 60 s after its restart");
        }
        Ok(())
    }

    /// Runs `fut` on the cluster's runtime (whose threads are in the node's namespace).
    pub fn block_on<F: Future>(&self, fut: F) -> F::Output {
        self.rt.block_on(fut)
    }

    pub fn handle(&self) -> tokio::runtime::Handle {
        self.rt.handle().clone()
    }

    /// Adds a component (e.g. istiod) stopped with the cluster, before the API server.
    pub fn adopt(&mut self, c: Proc) {
        self.components.push(c);
    }

    /// The running component named `name`.
    pub fn component(&mut self, name: &str) -> Option<&mut Proc> {
        self.components.iter_mut().find(|c| c.name == name)
    }

    /// Removes the component named `name` from the cluster, stopping it.
    pub fn stop_component(&mut self, name: &str, grace: Duration) -> Option<Proc> {
        let at = self.components.iter().position(|c| c.name == name)?;
        let mut c = self.components.remove(at);
        c.stop(grace);
        Some(c)
    }

    /// Every component's log and the kubelet's, for a failure message.
    pub fn logs_dir(&self) -> PathBuf {
        self.dir.join("logs")
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.kubelet.shutdown(&self.rt);
        while let Some(mut c) = self.components.pop() {
            c.stop(Duration::from_secs(5));
        }
        harness::kill_all_in(&self.node_ns);
        let _ = Command::new("ip")
            .args(["netns", "delete", &self.node_ns])
            .status();
        if std::thread::panicking() || std::env::var_os("KUBE_KEEP").is_some() {
            eprintln!("cluster {}: kept {}", self.id, self.dir.display());
        } else {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

/// A multi-thread runtime whose threads (workers and blocking pool) are in namespace `ns`.
fn node_runtime(ns: &str) -> Result<tokio::runtime::Runtime> {
    let ns = ns.to_string();
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .on_thread_start(move || {
            if let Err(e) = enter_netns(&ns) {
                // A thread outside the node's namespace would talk to the wrong loopback.
                panic!("runtime thread: {e:#}");
            }
        })
        .build()?)
}

async fn client_for(kubeconfig: &Path) -> Result<kube::Client> {
    let config = kube::Config::from_custom_kubeconfig(
        Kubeconfig::read_from(kubeconfig)?,
        &KubeConfigOptions::default(),
    )
    .await?;
    Ok(kube::Client::try_from(config)?)
}

/// The Node, as a kubelet registers it: Ready, its address, topology labels and kubelet version
/// (the injector chooses native sidecars from that version).
async fn create_node(client: &kube::Client) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let node: Node = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": NODE_NAME,
            "labels": {
                "kubernetes.io/hostname": NODE_NAME,
                "kubernetes.io/os": "linux",
                "topology.kubernetes.io/region": REGION,
                "topology.kubernetes.io/zone": ZONE,
            },
        },
        "spec": {"podCIDR": POD_CIDR, "podCIDRs": [POD_CIDR]},
    }))?;
    nodes.create(&PostParams::default(), &node).await?;
    let now = now_rfc3339();
    let status = serde_json::json!({
        "status": {
            "addresses": [
                {"type": "InternalIP", "address": NODE_IP},
                {"type": "Hostname", "address": NODE_NAME},
            ],
            "conditions": [{
                "type": "Ready", "status": "True", "reason": "KubeletReady",
                "message": "test kubelet is posting ready status",
                "lastHeartbeatTime": now, "lastTransitionTime": now,
            }],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": KUBELET_PORT}},
            "capacity": {"cpu": "2", "memory": "24Gi", "pods": "250"},
            "allocatable": {"cpu": "2", "memory": "24Gi", "pods": "250"},
            "nodeInfo": {
                "kubeletVersion": KUBE_VERSION, "kubeProxyVersion": "",
                "machineID": "", "systemUUID": "", "bootID": "", "kernelVersion": "",
                "osImage": "test kubelet", "containerRuntimeVersion": "netns://1",
                "operatingSystem": "linux", "architecture": std::env::consts::ARCH,
            },
        }
    });
    nodes
        .patch_status(NODE_NAME, &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    Ok(())
}

/// The cluster's certificates: a CA, the API server's serving certificate, an admin client
/// certificate (system:masters) and the service-account token signing key.
struct Pki {
    admin_crt: PathBuf,
    admin_key: PathBuf,
    ca_crt: PathBuf,
}

impl Pki {
    fn write(dir: &Path) -> Result<Pki> {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
        let pki = dir.join("pki");
        fs::create_dir_all(&pki)?;
        let ca_key = KeyPair::generate()?;
        let mut ca = CertificateParams::new(Vec::<String>::new())?;
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name.push(DnType::CommonName, "kube-ca");
        let ca_pem = ca.self_signed(&ca_key)?.pem();
        let issuer = Issuer::new(ca, ca_key);

        // One leaf: NAME.crt and NAME.key, for `sans`, with an organization (a group) if any.
        let leaf = |name: &str, sans: Vec<String>, org: Option<&str>, cn: &str| -> Result<()> {
            let key = KeyPair::generate()?;
            let mut params = CertificateParams::new(sans)?;
            if let Some(org) = org {
                params
                    .distinguished_name
                    .push(DnType::OrganizationName, org);
            }
            params.distinguished_name.push(DnType::CommonName, cn);
            fs::write(
                pki.join(format!("{name}.crt")),
                params.signed_by(&key, &issuer)?.pem(),
            )?;
            fs::write(pki.join(format!("{name}.key")), key.serialize_pem())?;
            Ok(())
        };
        let apiserver_names = [
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
            "127.0.0.1",
            NODE_IP,
            "10.96.0.1",
        ];
        leaf(
            "apiserver",
            apiserver_names.iter().map(|n| n.to_string()).collect(),
            None,
            "kube-apiserver",
        )?;
        leaf("admin", Vec::new(), Some("system:masters"), "admin")?;
        // The kubelet's serving certificate (the API server checks it when it proxies exec and
        // logs) and the client certificate the API server presents to the kubelet.
        leaf(
            "kubelet",
            vec![NODE_IP.to_string(), NODE_NAME.to_string()],
            None,
            &format!("system:node:{NODE_NAME}"),
        )?;
        leaf(
            "apiserver-kubelet-client",
            Vec::new(),
            Some("system:masters"),
            "kube-apiserver-kubelet-client",
        )?;

        let sa = KeyPair::generate()?;
        fs::write(pki.join("sa.key"), sa.serialize_pem())?;
        fs::write(pki.join("sa.pub"), sa.public_key_pem())?;
        fs::write(pki.join("ca.crt"), &ca_pem)?;
        Ok(Pki {
            admin_crt: pki.join("admin.crt"),
            admin_key: pki.join("admin.key"),
            ca_crt: pki.join("ca.crt"),
        })
    }

    fn kubeconfig(&self, server: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {server}\n    \
             certificate-authority: {}\nusers:\n- name: admin\n  user:\n    client-certificate: {}\n    \
             client-key: {}\ncontexts:\n- name: test\n  context: {{cluster: test, user: admin}}\n\
             current-context: test\n",
            self.ca_crt.display(),
            self.admin_crt.display(),
            self.admin_key.display()
        )
    }
}
