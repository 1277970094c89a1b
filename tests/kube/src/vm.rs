//! A VM beside the cluster's pods, set up as Istio's VM guide sets one up on the cluster's
//! network: a network namespace on the node's bridge with an address the kubelet will not hand
//! out (no kubelet runs it), a Debian root with our package installed by apt
//! (`harness::vm`), and the files `istioctl x workload entry configure` writes for a
//! WorkloadGroup placed where the guide puts them. The VM's resolver points at the node, where
//! no DNS server listens: only the agent's DNS proxy answers the VM's queries. Processes "on
//! the VM" run in its namespace as uid 1000 (an application user).

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;

use harness::Proc;
use harness::sandbox as netns;
use harness::vm::{GuideFiles, Vm, debian_root};

use crate::Cluster;
use crate::istioctl;
use crate::node::NODE_IP;

/// The VM's network: the pods' (the node's bridge, an address the kubelet does not hand out), or
/// one of its own that reaches the cluster only at `gateway` (the east-west gateway's address)
/// on 15443, 15012 and 15017, as Istio's multi-network VM guide has it: a bridge of its own on
/// the node, which forwards nothing else between it and the pods.
pub enum VmNetwork<'a> {
    Pods,
    Own { gateway: &'a str },
}

/// The own network's bridge, its range and the node's address on it.
const OWN_BRIDGE: &str = "vmbr0";
const OWN_NODE_IP: &str = "10.245.0.1";
const OWN_VM_IP: &str = "10.245.0.2";

/// Makes the node's bridge for a VM network of its own and lets through only the VM's
/// connections to the gateway (and their replies).
fn own_network(c: &Cluster, gateway: &str) -> Result<()> {
    let node = c.node_ns.as_str();
    for args in [
        vec!["link", "add", OWN_BRIDGE, "type", "bridge"],
        vec![
            "addr",
            "add",
            &format!("{OWN_NODE_IP}/24"),
            "dev",
            OWN_BRIDGE,
        ],
        vec!["link", "set", OWN_BRIDGE, "up"],
    ] {
        let mut full = vec!["-n", node];
        full.extend(args);
        harness::run("ip", &full)?;
    }
    netns::set_sysctl(node, "net.ipv4.ip_forward", "1")?;
    let rules = format!(
        "*filter\n:FORWARD ACCEPT [0:0]\n\
         -A FORWARD -i {OWN_BRIDGE} -d {gateway}/32 -p tcp -m multiport --dports 15443,15012,15017 -j ACCEPT\n\
         -A FORWARD -i {OWN_BRIDGE} -j DROP\n\
         -A FORWARD -o {OWN_BRIDGE} -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT\n\
         -A FORWARD -o {OWN_BRIDGE} -j DROP\nCOMMIT\n"
    );
    let mut child = Command::new("ip")
        .args(["netns", "exec", node, "iptables-restore", "--noflush"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .context("iptables-restore in the node's namespace")?;
    use std::io::Write as _;
    child
        .stdin
        .take()
        .context("iptables-restore's stdin")?
        .write_all(rules.as_bytes())?;
    if !child.wait()?.success() {
        bail!("iptables-restore of the VM network's forwarding rules failed");
    }
    Ok(())
}

pub struct MeshVm {
    pub ip: String,
    pub netns: String,
    pub dir: PathBuf,
    machine: Option<Vm>,
    app: Option<Proc>,
}

impl MeshVm {
    /// A Debian root with the package for a VM, made before the cluster starts: apt needs the
    /// host's network, and a cluster's thread lives in the node's namespace, which routes
    /// nowhere.
    pub fn prepare_root() -> Result<PathBuf> {
        let root =
            std::env::temp_dir().join(format!("{}-{}-vmroot", harness::PREFIX, std::process::id()));
        if root.exists() {
            std::fs::remove_dir_all(&root)?;
        }
        debian_root(&root).context("the VM's Debian root with the package")?;
        Ok(root)
    }

    /// The VM's namespace on the node's bridge, on the root `prepare_root` made (moved into the
    /// cluster's directory).
    pub fn create(
        c: &Cluster,
        name: &str,
        root: &std::path::Path,
        network: VmNetwork,
    ) -> Result<MeshVm> {
        let (ip, bridge, via) = match network {
            VmNetwork::Pods => (c.kubelet.reserve_address()?, "cbr0", NODE_IP),
            VmNetwork::Own { gateway } => {
                own_network(c, gateway)?;
                (OWN_VM_IP.to_string(), OWN_BRIDGE, OWN_NODE_IP)
            }
        };
        let ns = format!("{}-{name}", c.id);
        let dir = c.dir.join(name);
        std::fs::create_dir_all(&dir)?;
        netns::create(&netns::Spec {
            netns: &ns,
            bridge: netns::Bridge {
                netns: Some(&c.node_ns),
                name: bridge,
            },
            link: &format!("v{name}"),
            addresses: &[format!("{ip}/24")],
            routes: &[netns::Route {
                dest: "default",
                via: Some(via),
            }],
        })
        .with_context(|| format!("the VM {name}'s network"))?;
        let mut vm = MeshVm {
            ip,
            netns: ns.clone(),
            dir: dir.clone(),
            machine: None,
            app: None,
        };
        netns::write_etc(&ns, "hosts", b"127.0.0.1\tlocalhost\n")?;
        netns::write_etc(
            &ns,
            "resolv.conf",
            format!("nameserver {NODE_IP}\noptions ndots:5\n").as_bytes(),
        )?;
        let moved = dir.join("root");
        std::fs::rename(root, &moved)
            .with_context(|| format!("move {} into the cluster", root.display()))?;
        vm.machine = Some(Vm::new(&moved, &ns, &dir.join("tokens")));
        Ok(vm)
    }

    pub fn machine(&self) -> &Vm {
        self.machine
            .as_ref()
            .expect("the VM's machine lives as long as it")
    }

    /// `istioctl x workload entry configure -f GROUP_FILE -o DIR --autoregister` plus `extra`
    /// (`--clusterID`, ...), as the guide runs it, once the group's namespace has istiod's root
    /// certificate; the files are placed on the VM and returned.
    pub fn configure(&self, c: &Cluster, group_file: &str, extra: &[&str]) -> Result<GuideFiles> {
        let group: serde_json::Value = serde_yaml_ng::from_str(
            &std::fs::read_to_string(group_file).with_context(|| group_file.to_string())?,
        )?;
        let ns = group["metadata"]["namespace"]
            .as_str()
            .context("WorkloadGroup without a namespace")?
            .to_string();
        let maps: Api<ConfigMap> = Api::namespaced(c.client.clone(), &ns);
        let rooted = harness::wait_until(std::time::Duration::from_secs(30), || {
            c.block_on(maps.get_opt("istio-ca-root-cert"))
                .is_ok_and(|m| m.is_some())
        });
        if !rooted {
            bail!("no istio-ca-root-cert ConfigMap in {ns} after 30 s");
        }
        let out = self.dir.join("istioctl-out");
        let out_s = out.display().to_string();
        let mut args = vec![
            "x",
            "workload",
            "entry",
            "configure",
            "-f",
            group_file,
            "-o",
            &out_s,
            "--autoregister",
        ];
        args.extend(extra);
        istioctl::ok(c, &args)?;
        let files = GuideFiles::read(&out)?;
        self.machine().place(&files)?;
        Ok(files)
    }

    fn in_vm(&self, args: &[&str]) -> Vec<String> {
        let mut all: Vec<String> = [
            "ip",
            "netns",
            "exec",
            &self.netns,
            "setpriv",
            "--reuid=1000",
            "--regid=1000",
            "--clear-groups",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        all.extend(args.iter().map(|s| s.to_string()));
        all
    }

    /// The VM's application: an HTTP server on `port` answering every request with its headers.
    pub fn start_app(&mut self, port: u16) -> Result<()> {
        let probe = harness::binary("netprobe");
        let args = self.in_vm(&[
            probe.to_str().unwrap_or_default(),
            "http-echo",
            &port.to_string(),
        ]);
        self.app = Some(Proc::start(
            "vm-app",
            &args,
            &[],
            &self.dir,
            &self.dir.join("app.log"),
        )?);
        Ok(())
    }

    pub fn stop_app(&mut self) {
        if let Some(mut app) = self.app.take() {
            app.stop(std::time::Duration::from_secs(2));
        }
    }

    /// One GET from the VM's application user: (status, body); status 0 when none came.
    pub fn curl(&self, url: &str) -> Result<(u16, String)> {
        let args = self.in_vm(&["curl", "-s", "-m", "10", "-w", "\n%{http_code}", url]);
        let out = Command::new(&args[0]).args(&args[1..]).output()?;
        Ok(crate::bookinfo::status_and_body(&out.stdout))
    }

    /// The VM's capture rules (iptables of either backend).
    pub fn capture_rules(&self) -> String {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.netns, "sh", "-c"])
            .arg("iptables-nft-save 2>/dev/null; iptables-legacy-save 2>/dev/null")
            .output();
        out.map(|o| String::from_utf8_lossy(&o.stdout).to_string())
            .unwrap_or_default()
    }

    /// The agent's logs on the VM.
    pub fn logs(&self) -> String {
        self.machine().logs()
    }
}

impl Drop for MeshVm {
    fn drop(&mut self) {
        self.machine.take();
        self.stop_app();
        harness::kill_all_in(&self.netns);
        netns::remove(&self.netns);
    }
}
