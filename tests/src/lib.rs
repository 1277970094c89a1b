//! Test harness for real-process tests: pods as network namespaces joined through a bridge in a
//! hub namespace, each with IPv4 and IPv6 addresses; processes run inside a pod as a chosen
//! uid/gid with their output captured to files; everything is removed on drop, and namespaces
//! left by killed runs (the harness prefix plus a dead pid) are swept at start.
//!
//! Tests that need root call [`require_root`] (and Envoy [`require_envoy`]): a missing capability
//! is a failure unless skipping was asked for with `SKIP_E2E=1`.

use std::fs;
use std::net::Ipv4Addr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

pub mod collector;
pub mod istio;
pub mod podman;
pub mod sandbox;
pub mod vm;
pub mod xds_descriptors;

/// Every namespace the harness creates starts with this.
pub const PREFIX: &str = "istt";

static NEXT: AtomicU32 = AtomicU32::new(0);

/// Pod addresses: 10.233.0.N/24 and fd00:233::N/64 on the pod's eth0. These exist only inside
/// namespaces the harness creates; the namespaces have no route to anything else.
pub fn pod_ipv4(n: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 233, 0, n)
}

/// The downward-API annotations file line that keeps every Envoy stat (see `Network::add_pod`).
pub const ALL_ENVOY_STATS: &str = "sidecar.istio.io/statsInclusionRegexps=\".*\"\n";

/// Service VIPs are taken from this range; pods route it to their eth0 (it never leaves the hub).
pub const VIP_RANGE: &str = "10.234.0.0/16";
/// Istio's range of auto-allocated ServiceEntry addresses: pods route it to their eth0 too, as a
/// pod's default route would take it (Envoy catches the connection before it leaves).
pub const AUTO_ALLOCATED_RANGE: &str = "240.240.0.0/16";

/// The args Istio's sidecar injector gives the istio-init container (its log flag aside).
pub use istio_init::INJECTOR_ARGS as INJECTOR_INIT_ARGS;

/// Runs istio-iptables in `pod` with the injector's args plus `extra`, and fails with its
/// output unless it succeeds.
pub fn istio_iptables(pod: &Pod, extra: &[&str]) -> Result<Output> {
    let bin = binary("istio-iptables");
    let mut args = vec![bin.to_str().unwrap_or_default()];
    args.extend(INJECTOR_INIT_ARGS);
    args.extend(extra);
    let out = pod.exec(&args)?;
    if !out.status.success() {
        bail!(
            "istio-iptables failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(out)
}

/// Skipping is asked for, never assumed: with SKIP_E2E=1 a test that cannot run here is skipped
/// (and says so); otherwise it fails, so the documented command cannot pass without them.
pub fn cannot_run(why: &str) -> bool {
    if std::env::var("SKIP_E2E").is_ok_and(|v| v == "1") {
        eprintln!("\n!!!!! SKIPPED (SKIP_E2E=1) {why} !!!!!\n");
        return false;
    }
    panic!("{why}; run as root after scripts/setup.sh, or set SKIP_E2E=1 to skip it explicitly");
}

/// Where an install script put its tools: `$VAR` when set and not empty, else `default`.
pub fn install_home(var: &str, default: &str) -> PathBuf {
    std::env::var_os(var)
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(default))
}

/// The path of `home/bin/name`, installed by `installer`. Missing, it is a test failure naming
/// the set-up step (`what` names the binary); `Err` only when SKIP_E2E=1 asked to skip instead,
/// and the caller returns.
pub fn installed_bin(home: &Path, name: &str, what: &str, installer: &str) -> Result<PathBuf> {
    let path = home.join("bin").join(name);
    if path.is_file() {
        return Ok(path);
    }
    let why = format!(
        "{what} is not at {} (run scripts/setup.sh --tests, which runs {installer})",
        path.display()
    );
    cannot_run(&why);
    bail!("skipped: {why}")
}

/// Returns true if the test can run as root; see `cannot_run` for when it cannot.
pub fn require_root(test: &str) -> bool {
    if nix::unistd::geteuid().is_root() && which("ip") && which("iptables") {
        return true;
    }
    cannot_run(&format!("{test}: needs root, `ip` and `iptables`"))
}

/// Returns true if Envoy is installed; see `cannot_run` for when it is not.
pub fn require_envoy(test: &str) -> bool {
    if Path::new(&envoy_path()).exists() {
        return true;
    }
    cannot_run(&format!(
        "{test}: needs Envoy at {} (run scripts/setup.sh)",
        envoy_path()
    ))
}

pub fn envoy_path() -> String {
    std::env::var("ENVOY_BIN").unwrap_or_else(|_| "/usr/local/bin/envoy".to_string())
}

fn which(cmd: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(cmd).exists()))
        .unwrap_or(false)
}

/// Writes `contents` at `path` (parents created) readable by every uid (0644): files the pods'
/// other users (the app, Envoy as 1337) read.
pub fn write_readable(path: &Path, contents: impl AsRef<[u8]>) -> Result<()> {
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent)?;
    }
    fs::write(path, contents)?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o644))?;
    Ok(())
}

/// Runs a command to completion, failing with its output if it fails.
pub fn run(cmd: &str, args: &[&str]) -> Result<Output> {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .with_context(|| format!("spawn {cmd}"))?;
    if !out.status.success() {
        bail!(
            "{cmd} {} failed ({}): {}{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(out)
}

/// Kills every process left in namespace `ns` (e.g. an Envoy whose agent was killed).
pub fn kill_all_in(ns: &str) {
    let Ok(out) = Command::new("ip").args(["netns", "pids", ns]).output() else {
        return;
    };
    for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
        if let Ok(pid) = pid.parse::<i32>() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

/// Pids of processes in namespace `ns` whose command name is `comm`.
pub fn pids_named(ns: &str, comm: &str) -> Vec<i32> {
    let Ok(out) = Command::new("ip").args(["netns", "pids", ns]).output() else {
        return Vec::new();
    };
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(|p| p.parse::<i32>().ok())
        .filter(|p| fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == comm))
        .collect()
}

/// True if `name` is one of ours (`PREFIX-PID-...`) and process PID is gone.
pub fn orphaned(name: &str) -> bool {
    let mut parts = name.split('-');
    parts.next() == Some(PREFIX)
        && !parts
            .next()
            .and_then(|p| p.parse::<i32>().ok())
            .is_some_and(|pid| Path::new(&format!("/proc/{pid}")).exists())
}

/// Deletes namespaces with our prefix whose creating process is gone.
pub fn sweep_stale() {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let name = line.split_whitespace().next().unwrap_or_default();
        if orphaned(name) {
            kill_all_in(name);
            let _ = fs::remove_dir_all(Path::new("/etc/netns").join(name));
            let _ = Command::new("ip").args(["netns", "delete", name]).status();
        }
    }
}

/// Absolute path of a workspace binary built by cargo (target/<profile>/NAME).
pub fn binary(name: &str) -> PathBuf {
    if let Ok(dir) = std::env::var("E2E_BIN_DIR") {
        return PathBuf::from(dir).join(name);
    }
    // tests run from target/<profile>/deps/<test-binary>
    let exe = std::env::current_exe().unwrap_or_default();
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .unwrap_or_default();
    profile_dir.join(name)
}

/// A process running inside a pod.
pub struct Proc {
    pub name: String,
    child: Child,
    pub log: PathBuf,
}

impl Proc {
    /// Starts `args` in the calling thread's network namespace, in `cwd`, with the test's env
    /// plus `env`, its output to `log`.
    pub fn start(
        name: &str,
        args: &[String],
        env: &[(String, String)],
        cwd: &Path,
        log: &Path,
    ) -> Result<Proc> {
        let (program, rest) = args
            .split_first()
            .with_context(|| format!("{name}: no command"))?;
        let file = fs::File::create(log).with_context(|| format!("create {}", log.display()))?;
        let child = Command::new(program)
            .args(rest)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .current_dir(cwd)
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .spawn()
            .with_context(|| format!("start {name} ({program})"))?;
        Ok(Proc {
            name: name.to_string(),
            child,
            log: log.to_path_buf(),
        })
    }

    /// True while the process runs.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// SIGTERM, then SIGKILL once `grace` has passed; waits for the exit.
    pub fn stop(&mut self, grace: Duration) {
        if !self.running() {
            return;
        }
        let _ = self.signal(nix::sys::signal::Signal::SIGTERM);
        let _ = self.wait_timeout(grace);
        if self.running() {
            let _ = self.signal(nix::sys::signal::Signal::SIGKILL);
        }
        let _ = self.child.wait();
    }

    pub fn pid(&self) -> i32 {
        i32::try_from(self.child.id()).unwrap_or(0)
    }

    pub fn signal(&self, sig: nix::sys::signal::Signal) -> Result<()> {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid()), sig)?;
        Ok(())
    }

    pub fn try_wait(&mut self) -> Result<Option<ExitStatus>> {
        Ok(self.child.try_wait()?)
    }

    /// Waits up to `limit` for the process to exit.
    pub fn wait_timeout(&mut self, limit: Duration) -> Result<ExitStatus> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(s) = self.child.try_wait()? {
                return Ok(s);
            }
            if Instant::now() > deadline {
                bail!("{} did not exit within {limit:?}", self.name);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn logs(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.signal(nix::sys::signal::Signal::SIGKILL);
            let _ = self.child.wait();
        }
    }
}

/// A pod: a network namespace with eth0 on the hub bridge, and a working directory.
pub struct Pod {
    pub ns: String,
    pub ip: Ipv4Addr,
    pub dir: PathBuf,
    procs: Vec<Proc>,
}

impl Pod {
    /// Runs a command in the pod as root and waits for it.
    pub fn exec(&self, args: &[&str]) -> Result<Output> {
        let mut full = vec!["netns", "exec", self.ns.as_str()];
        full.extend_from_slice(args);
        Ok(Command::new("ip").args(&full).output()?)
    }

    /// Runs a command in the pod as `uid:gid` and waits for it.
    pub fn exec_as(&self, uid: u32, gid: u32, args: &[&str]) -> Result<Output> {
        let (u, g) = (uid.to_string(), gid.to_string());
        let mut full = vec![
            "setpriv",
            "--reuid",
            &u,
            "--regid",
            &g,
            "--clear-groups",
            "--",
        ];
        full.extend_from_slice(args);
        self.exec(&full)
    }

    /// Starts a long-running process in the pod as `uid:gid` (root: 0,0) with `env`, in the pod's
    /// working directory, logging to `<dir>/<name>.log`.
    pub fn spawn(
        &mut self,
        name: &str,
        uid: u32,
        gid: u32,
        env: &[(&str, &str)],
        args: &[&str],
    ) -> Result<&mut Proc> {
        let dir = self.dir.clone();
        self.spawn_in(&dir, name, uid, gid, env, args)
    }

    /// `spawn` with another working directory (still logging to the pod's `<dir>/<name>.log`).
    pub fn spawn_in(
        &mut self,
        cwd: &Path,
        name: &str,
        uid: u32,
        gid: u32,
        env: &[(&str, &str)],
        args: &[&str],
    ) -> Result<&mut Proc> {
        let log = self.dir.join(format!("{name}.log"));
        let file = fs::File::create(&log)?;
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.ns]);
        if uid != 0 || gid != 0 {
            cmd.args([
                "setpriv",
                "--reuid",
                &uid.to_string(),
                "--regid",
                &gid.to_string(),
                "--clear-groups",
                "--",
            ]);
        }
        cmd.args(args)
            .current_dir(cwd)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            // The test run's choice of the control plane's checked cache (scripts/test.sh).
            .envs(
                std::env::var("ISTIOD_CACHE_CHECK")
                    .ok()
                    .map(|v| ("ISTIOD_CACHE_CHECK", v)),
            )
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file);
        let child = cmd.spawn().with_context(|| format!("spawn {name}"))?;
        self.procs.push(Proc {
            name: name.to_string(),
            child,
            log,
        });
        let last = self.procs.len() - 1;
        Ok(&mut self.procs[last])
    }

    /// `pilot-agent proxy sidecar --configDir MESH` as root (the embedded control plane), with
    /// `env` as the injector would set it; its process is named "pilot-agent".
    pub fn spawn_embedded_agent(&mut self, mesh: &Path, env: &[(&str, &str)]) -> Result<&mut Proc> {
        // The container's stdout belongs to its user, as runc gives it: Envoy (1337) reopens
        // /dev/stdout for access logs (`spawn` truncates the file and keeps its owner).
        let log = self.dir.join("pilot-agent.log");
        fs::File::create(&log)?;
        std::os::unix::fs::chown(&log, Some(ENVOY_UID), Some(ENVOY_UID))?;
        let agent = binary("pilot-agent");
        let (agent, mesh) = (agent.to_string_lossy(), mesh.to_string_lossy());
        self.spawn(
            "pilot-agent",
            0,
            0,
            env,
            &[&agent, "proxy", "sidecar", "--configDir", &mesh],
        )
    }

    /// The embedded agent as Istio's injector starts it for `workload`: its name in the node
    /// metadata, the pod's labels in the downward-API file, its namespace, service account,
    /// cluster and ProxyConfig in the environment.
    pub fn spawn_workload_agent(
        &mut self,
        mesh: &Path,
        workload: &Workload<'_>,
    ) -> Result<&mut Proc> {
        let pod_info = self.dir.join("etc/istio/pod");
        fs::create_dir_all(&pod_info)?;
        fs::write(pod_info.join("labels"), workload.labels)?;
        let ip = self.ip.to_string();
        let pod_name = format!("{}-0", workload.name);
        self.spawn_embedded_agent(
            mesh,
            &[
                ("POD_NAME", &pod_name),
                ("POD_NAMESPACE", workload.namespace),
                ("INSTANCE_IP", &ip),
                ("SERVICE_ACCOUNT", workload.service_account),
                ("ISTIO_META_WORKLOAD_NAME", workload.name),
                ("ISTIO_META_CLUSTER_ID", workload.cluster),
                ("PROXY_CONFIG", workload.proxy_config),
            ],
        )
    }

    /// A dnsmasq answering on this pod's address, with `--address=` rules such as
    /// `/example.test/10.0.0.1`; `false` (and a failure unless SKIP_E2E=1) without dnsmasq.
    pub fn spawn_dnsmasq(&mut self, rules: &[&str]) -> bool {
        let Some(dnsmasq) = ["/usr/sbin/dnsmasq", "/usr/bin/dnsmasq"]
            .into_iter()
            .find(|p| Path::new(p).exists())
        else {
            return cannot_run("dnsmasq missing (scripts/setup.sh installs it)");
        };
        let listen = format!("--listen-address={}", self.ip);
        let mut args = vec![
            dnsmasq,
            "--keep-in-foreground",
            "--no-resolv",
            "--no-hosts",
            "--bind-interfaces",
            &listen,
            "--user=root",
            "--pid-file=",
        ];
        let rules: Vec<String> = rules.iter().map(|r| format!("--address={r}")).collect();
        args.extend(rules.iter().map(String::as_str));
        self.spawn("dnsmasq", 0, 0, &[], &args).is_ok()
    }

    pub fn proc(&mut self, name: &str) -> Option<&mut Proc> {
        self.procs.iter_mut().find(|p| p.name == name)
    }

    /// The captured output of the process `name` so far.
    pub fn has_proc(&self, name: &str) -> bool {
        self.procs.iter().any(|p| p.name == name)
    }

    pub fn logs_of(&self, name: &str) -> String {
        self.procs
            .iter()
            .find(|p| p.name == name)
            .map(Proc::logs)
            .unwrap_or_default()
    }

    /// Waits until the output of process `name` contains `needle`, up to `limit`.
    pub fn wait_log(&self, name: &str, needle: &str, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if self.logs_of(name).contains(needle) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }

    /// Gives the pod its own /etc/resolv.conf (`ip netns exec` bind-mounts /etc/netns/NS/*).
    pub fn set_resolv_conf(&self, text: &str) -> Result<()> {
        sandbox::write_etc(&self.ns, "resolv.conf", text.as_bytes())
    }

    /// Puts a file at `/etc/REL` as the pod's processes see it (a container image's file;
    /// `sandbox::write_etc`).
    pub fn etc_file(&self, rel: &str, contents: &[u8]) -> Result<()> {
        sandbox::write_etc(&self.ns, rel, contents)
    }

    /// Lets unprivileged processes (Envoy as 1337) bind ports below 1024, as the pod sysctl
    /// `net.ipv4.ip_unprivileged_port_start=0` of Istio's gateway charts does.
    pub fn allow_low_ports(&self) -> Result<()> {
        sandbox::set_sysctl(&self.ns, "net.ipv4.ip_unprivileged_port_start", "0")
    }

    /// All captured logs, for failure messages.
    pub fn logs(&self) -> String {
        self.procs
            .iter()
            .map(|p| format!("----- {}/{} -----\n{}", self.ns, p.name, p.logs()))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// HTTP GET from inside the pod with curl as `uid`; returns (status, body).
    pub fn http_get(&self, uid: u32, url: &str) -> Result<(u16, String)> {
        let out = self.exec_as(
            uid,
            uid,
            &[
                "curl",
                "-sS",
                "--max-time",
                "5",
                "-o",
                "-",
                "-w",
                "\n%{http_code}",
                url,
            ],
        )?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
        Ok((code.trim().parse().unwrap_or(0), body.to_string()))
    }

    /// Polls `url` from inside the pod until it answers 200, up to `limit`.
    pub fn wait_http_ok(&self, url: &str, limit: Duration) -> Result<()> {
        let deadline = Instant::now() + limit;
        let mut last = (0, String::new());
        while Instant::now() < deadline {
            last = self.http_get(0, url)?;
            if last.0 == 200 {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        bail!(
            "{url} in {} not 200 within {limit:?}; last: {last:?}",
            self.ns
        )
    }

    /// Reads one counter from the pod's Envoy admin (`/stats?filter=^NAME$`); 0 if absent.
    pub fn envoy_stat(&self, name: &str) -> Result<u64> {
        let url = format!(
            "http://127.0.0.1:15000/stats?filter=^{}$",
            name.replace('|', "%7C")
        );
        let (code, body) = self.http_get(0, &url)?;
        if code != 200 {
            bail!("Envoy admin in {} answered {code}", self.ns);
        }
        Ok(body
            .lines()
            .find_map(|l| l.split_once(": ").filter(|(n, _)| *n == name))
            .and_then(|(_, v)| v.trim().parse().ok())
            .unwrap_or(0))
    }
}

/// The tests' usual HTTP service: a ServiceEntry `httpbin` in `namespace` for `host` on `vip`,
/// HTTP on `port`, selecting `app: httpbin`, and its one WorkloadEntry (service account
/// `httpbin`) at `server_ip`; YAML documents for a config directory.
pub fn httpbin_entries(
    namespace: &str,
    host: &str,
    vip: &str,
    port: u16,
    server_ip: &str,
) -> String {
    format!(
        r#"kind: ServiceEntry
metadata: {{name: httpbin, namespace: {namespace}}}
spec:
  hosts: [{host}]
  addresses: [{vip}]
  ports: [{{number: {port}, name: http, protocol: HTTP}}]
  workloadSelector: {{labels: {{app: httpbin}}}}
---
kind: WorkloadEntry
metadata: {{name: httpbin-1, namespace: {namespace}}}
spec: {{address: {server_ip}, labels: {{app: httpbin}}, serviceAccount: httpbin}}
"#
    )
}

/// A workload as the injector describes it to its agent (`Pod::spawn_workload_agent`).
pub struct Workload<'a> {
    pub namespace: &'a str,
    pub service_account: &'a str,
    /// The workload's name (`ISTIO_META_WORKLOAD_NAME`; the pod is `NAME-0`).
    pub name: &'a str,
    /// The pod's labels in the downward-API format (`app="x"`, one per line).
    pub labels: &'a str,
    /// `ISTIO_META_CLUSTER_ID`.
    pub cluster: &'a str,
    /// `PROXY_CONFIG` (JSON).
    pub proxy_config: &'a str,
}

/// Envoy's uid in a pod (Istio's proxy user).
pub const ENVOY_UID: u32 = 1337;

/// A set of pods on one bridge. Dropping it kills their processes and deletes the namespaces.
pub struct Network {
    id: String,
    hub: String,
    pub pods: Vec<Pod>,
    root: PathBuf,
}

impl Network {
    pub fn new() -> Result<Network> {
        sweep_stale();
        let id = format!(
            "{PREFIX}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let root = std::env::temp_dir().join(&id);
        fs::create_dir_all(&root)?;
        fs::set_permissions(&root, fs::Permissions::from_mode(0o755))?;
        let hub = format!("{id}-hub");
        let net = Network {
            id,
            hub: hub.clone(),
            pods: Vec::new(),
            root,
        };
        run("ip", &["netns", "add", &hub])?;
        run("ip", &["-n", &hub, "link", "add", "br0", "type", "bridge"])?;
        run("ip", &["-n", &hub, "link", "set", "br0", "up"])?;
        Ok(net)
    }

    /// Adds pod number `n` (address 10.233.0.n, fd00:233::n) and returns its index.
    pub fn add_pod(&mut self, name: &str, n: u8) -> Result<usize> {
        let ns = format!("{}-{name}", self.id);
        let dir = self.root.join(name);
        fs::create_dir_all(&dir)?;
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755))?;
        let ip = pod_ipv4(n);
        let outside = |dest| sandbox::Route { dest, via: None };
        sandbox::create(&sandbox::Spec {
            netns: &ns,
            bridge: sandbox::Bridge {
                netns: Some(&self.hub),
                name: "br0",
            },
            link: &format!("v{n}"),
            addresses: &[format!("{ip}/24"), format!("fd00:233::{n}/64")],
            routes: &[outside(VIP_RANGE), outside(AUTO_ALLOCATED_RANGE)],
        })?;
        // The tests read Envoy's counters of the traffic they send (`Pod::envoy_stat`), which
        // Istio's stats inclusion list leaves out: each pod is annotated to keep all of Envoy's
        // stats, as a user debugging a sidecar would. The default list is proven by
        // bootstrap_oracle (against Istio's pilot-agent) and stats_e2e (what 15090 serves).
        let pod_info = dir.join("etc/istio/pod");
        fs::create_dir_all(&pod_info)?;
        write_readable(&pod_info.join("annotations"), ALL_ENVOY_STATS)?;
        self.pods.push(Pod {
            ns,
            ip,
            dir,
            procs: Vec::new(),
        });
        Ok(self.pods.len() - 1)
    }

    pub fn dir(&self) -> &Path {
        &self.root
    }

    pub fn logs(&self) -> String {
        self.pods
            .iter()
            .map(Pod::logs)
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        for pod in &mut self.pods {
            pod.procs.clear();
            kill_all_in(&pod.ns);
            sandbox::remove(&pod.ns);
        }
        let _ = Command::new("ip")
            .args(["netns", "delete", &self.hub])
            .status();
        if std::env::var_os("E2E_KEEP_LOGS").is_none() {
            let _ = fs::remove_dir_all(&self.root);
        }
    }
}

/// A mesh CA for tests of a standalone `istiod-core serve`: a root directory and a key that
/// signs service-account tokens, as a Kubernetes API server would.
pub struct TestCa {
    pub dir: PathBuf,
    pub jwt_public_key: PathBuf,
    signer: rcgen::KeyPair,
}

/// The issuer `istiod-core serve` expects by default.
pub const JWT_ISSUER: &str = "https://kubernetes.default.svc.cluster.local";

impl TestCa {
    pub fn new(dir: &Path) -> Result<TestCa> {
        fs::create_dir_all(dir)?;
        let signer = rcgen::KeyPair::generate()?;
        let jwt_public_key = dir.join("sa-signer.pub");
        fs::write(&jwt_public_key, signer.public_key_pem())?;
        Ok(TestCa {
            dir: dir.join("cacerts"),
            jwt_public_key,
            signer,
        })
    }

    /// `istiod-core serve` flags that turn on the CA.
    pub fn serve_args(&self) -> Vec<String> {
        vec![
            "--ca-dir".into(),
            self.dir.display().to_string(),
            "--jwt-public-key".into(),
            self.jwt_public_key.display().to_string(),
        ]
    }

    /// The command line of `istiod-core serve` for `config_dir` on `grpc_addr`, with this CA
    /// and any `extra` flags.
    pub fn serve_command(&self, config_dir: &Path, grpc_addr: &str, extra: &[&str]) -> Vec<String> {
        let mut args: Vec<String> = vec![
            binary("istiod-core").display().to_string(),
            "serve".into(),
            "--config-dir".into(),
            config_dir.display().to_string(),
            "--grpc-addr".into(),
            grpc_addr.into(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        args.extend(self.serve_args());
        args
    }

    /// Starts `serve_command` in `pod` as the process `istiod-core`.
    pub fn spawn_control_plane(
        &self,
        pod: &mut Pod,
        config_dir: &Path,
        grpc_addr: &str,
        extra: &[&str],
    ) -> Result<()> {
        let args = self.serve_command(config_dir, grpc_addr, extra);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        pod.spawn("istiod-core", 0, 0, &[], &args)?;
        Ok(())
    }

    /// The root certificate, once the server has created it.
    pub fn root_cert(&self) -> PathBuf {
        self.dir.join("root-cert.pem")
    }

    /// A service-account token (audience istio-ca) valid for an hour.
    pub fn token(&self, namespace: &str, service_account: &str) -> Result<String> {
        let exp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_secs()
            + 3600;
        let claims = serde_json::json!({
            "sub": format!("system:serviceaccount:{namespace}:{service_account}"),
            "aud": "istio-ca",
            "iss": JWT_ISSUER,
            "exp": exp,
        });
        Ok(jsonwebtoken::encode(
            &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::ES256),
            &claims,
            &jsonwebtoken::EncodingKey::from_ec_pem(self.signer.serialize_pem().as_bytes())?,
        )?)
    }

    /// Writes the token where the agent reads it (`./var/run/secrets/tokens/istio-token`).
    pub fn give_token(&self, pod: &Pod, namespace: &str, service_account: &str) -> Result<()> {
        let dir = pod.dir.join("var/run/secrets/tokens");
        fs::create_dir_all(&dir)?;
        fs::write(
            dir.join("istio-token"),
            self.token(namespace, service_account)?,
        )?;
        Ok(())
    }
}

/// The last `lines` lines of `text` (for failure messages quoting a log).
pub fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Polls `f` every 200 ms until it returns true or `limit` passes.
pub fn wait_until(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    false
}

/// Waits until every pod running a pilot-agent answers 200 on Envoy's 15021 readiness port.
pub fn wait_ready(net: &Network) {
    for pod in net.pods.iter().filter(|p| p.has_proc("pilot-agent")) {
        let ready = pod.wait_http_ok(
            "http://127.0.0.1:15021/healthz/ready",
            Duration::from_secs(60),
        );
        assert!(ready.is_ok(), "{ready:?}\n{}", net.logs());
    }
}
