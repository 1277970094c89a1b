//! The mesh the end-to-end tests of traffic management and authorization share: a client pod
//! and backend pods (each an app with its sidecar and the embedded control plane), a config
//! dir, and a client that reports what each request got.
#![allow(dead_code)] // each test file uses its own part

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use harness::{Network, Pod, require_envoy, require_root, wait_ready, wait_until};

pub const APP_UID: u32 = 1000;
pub const NS: &str = "book";
pub const VIP: &str = "10.234.0.20";
pub const MIRROR_VIP: &str = "10.234.0.21";
pub const TCP_VIP: &str = "10.234.0.22";
pub const PORT: u16 = 8000;
pub const TCP_PORT: u16 = 9000;

/// Each backend: HTTP on PORT answering `instance=NAME path=PATH` plus the request headers
/// named in `x-echo`, and a TCP line service on TCP_PORT answering `NAME`. Paths:
/// `/status/N` answers N; `/sleep/MS` waits; `/flaky` fails every other request (503) for
/// this instance; `/fail/NAME` fails (503) on instance NAME only; with FAIL=1 every request
/// fails (503). Each request line goes to stdout.
pub const APP: &str = r#"
import os, socketserver, sys, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
NAME = os.environ["NAME"]
FAIL = os.environ.get("FAIL") == "1"
count = {"flaky": 0}
lock = threading.Lock()
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a):
        pass
    def do_GET(self):
        print(f"{NAME} {self.command} {self.path} host={self.headers.get('host')}", flush=True)
        code = 200
        if FAIL:
            code = 503
        elif self.path.startswith("/status/"):
            code = int(self.path.split("/")[2])
        elif self.path.startswith("/sleep/"):
            time.sleep(int(self.path.split("/")[2]) / 1000)
        elif self.path.startswith("/fail/"):
            code = 503 if self.path.split("/")[2] == NAME else 200
        elif self.path == "/flaky":
            with lock:
                count["flaky"] += 1
                if count["flaky"] % 2 == 1:
                    code = 503
        echo = "".join(f" {h}={self.headers.get(h)}" for h in self.headers.get("x-echo", "").split(",") if h)
        body = f"instance={NAME} path={self.path}{echo}\n".encode()
        self.send_response(code)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    do_POST = do_GET
class T(socketserver.StreamRequestHandler):
    def handle(self):
        self.rfile.readline()
        self.wfile.write(f"{NAME}\n".encode())
class TS(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
threading.Thread(target=TS(("0.0.0.0", 9000), T).serve_forever, daemon=True).start()
httpd = ThreadingHTTPServer(("0.0.0.0", 8000), H)
if os.environ.get("TLS_CERT"):
    import ssl
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(os.environ["TLS_CERT"], os.environ["TLS_KEY"])
    httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
httpd.serve_forever()
"#;

/// Sends requests and prints one line each: `STATUS SECONDS BODY-FIRST-LINE`, and for `-H`
/// headers given as JSON. Args: url count headers-json [concurrency] [method].
pub const CLIENT: &str = r#"
import json, sys, time, urllib.request, urllib.error
from concurrent.futures import ThreadPoolExecutor
url, n, headers = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
workers = int(sys.argv[4]) if len(sys.argv) > 4 else 1
def one(_):
    req = urllib.request.Request(url, headers=headers)
    start = time.time()
    try:
        with urllib.request.urlopen(req, timeout=20) as r:
            code, body, hdrs = r.status, r.read().decode(errors="replace"), r.headers
    except urllib.error.HTTPError as e:
        code, body, hdrs = e.code, e.read().decode(errors="replace"), e.headers
    except Exception as e:
        code, body, hdrs = 0, repr(e), {}
    extra = " overloaded" if hdrs.get("x-envoy-overloaded") else ""
    loc = f" location={hdrs.get('location')}" if hdrs.get("location") else ""
    return f"{code} {time.time() - start:.3f}{extra}{loc} {body.splitlines()[0] if body else ''}"
class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *a, **k):
        return None
urllib.request.install_opener(urllib.request.build_opener(NoRedirect))
with ThreadPoolExecutor(workers) as pool:
    for line in pool.map(one, range(n)):
        print(line, flush=True)
"#;

/// One response as the client saw it.
#[derive(Debug, Clone)]
pub struct Reply {
    pub code: u16,
    pub secs: f64,
    pub overloaded: bool,
    pub location: Option<String>,
    pub body: String,
}

impl Reply {
    pub fn instance(&self) -> &str {
        self.body
            .split_whitespace()
            .find_map(|w| w.strip_prefix("instance="))
            .unwrap_or("")
    }
    pub fn field(&self, name: &str) -> Option<&str> {
        let prefix = format!("{name}=");
        self.body
            .split_whitespace()
            .find_map(|w| w.strip_prefix(prefix.as_str()))
    }
}

pub struct Mesh {
    pub net: Network,
    pub dir: PathBuf,
    /// Backend name → pod index.
    pub backends: BTreeMap<&'static str, usize>,
}

pub const CLIENT_POD: usize = 0;

/// A backend pod: its name, its WorkloadEntry labels (YAML flow), its app's extra env. Empty
/// labels: a server outside the mesh (no WorkloadEntry, no capture, no sidecar).
pub type Backend = (
    &'static str,
    &'static str,
    &'static [(&'static str, &'static str)],
);

pub fn services() -> String {
    format!(
        r#"kind: ServiceEntry
metadata: {{name: reviews, namespace: {NS}}}
spec:
  hosts: [reviews.{NS}.svc.cluster.local]
  addresses: [{VIP}]
  location: MESH_INTERNAL
  ports: [{{number: {PORT}, name: http, protocol: HTTP}}]
  workloadSelector: {{labels: {{app: reviews}}}}
---
kind: ServiceEntry
metadata: {{name: mirror, namespace: {NS}}}
spec:
  hosts: [mirror.{NS}.svc.cluster.local]
  addresses: [{MIRROR_VIP}]
  location: MESH_INTERNAL
  ports: [{{number: {PORT}, name: http, protocol: HTTP}}]
  workloadSelector: {{labels: {{app: mirror}}}}
---
kind: ServiceEntry
metadata: {{name: lines, namespace: {NS}}}
spec:
  hosts: [lines.{NS}.svc.cluster.local]
  addresses: [{TCP_VIP}]
  location: MESH_INTERNAL
  ports: [{{number: {TCP_PORT}, name: tcp, protocol: TCP}}]
  workloadSelector: {{labels: {{app: reviews}}}}
---
kind: DestinationRule
metadata: {{name: versions, namespace: {NS}}}
spec:
  host: lines
  subsets:
  - {{name: v1, labels: {{version: v1}}}}
  - {{name: v2, labels: {{version: v2}}}}
"#
    )
}

/// A client pod and one pod per backend (`name`, app labels, extra env), all with capture
/// and a sidecar, the config dir holding the services, the backends and `routing`.
pub fn mesh(test: &str, backends: &[Backend], routing: &str) -> Option<Mesh> {
    mesh_with(test, backends, routing, |_| {})
}

/// `mesh`, with `before` run once the pods exist and before any sidecar starts.
pub fn mesh_with(
    test: &str,
    backends: &[Backend],
    routing: &str,
    before: impl FnOnce(&mut Network),
) -> Option<Mesh> {
    if !require_root(test) || !require_envoy(test) {
        return None;
    }
    let mut net = Network::new().unwrap();
    net.add_pod("client", 2).unwrap();
    let mut yaml = services();
    let mut index = BTreeMap::new();
    for (i, (name, labels, _)) in backends.iter().enumerate() {
        let n = u8::try_from(3 + i).unwrap();
        let idx = net.add_pod(name, n).unwrap();
        index.insert(*name, idx);
        if labels.is_empty() {
            continue;
        }
        yaml.push_str(&format!(
            "---\nkind: WorkloadEntry\nmetadata: {{name: {name}, namespace: {NS}}}\nspec: {{address: {}, labels: {{{labels}}}, serviceAccount: {name}}}\n",
            net.pods[idx].ip
        ));
    }
    let dir = net.dir().join("mesh");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("services.yaml"), yaml).unwrap();
    std::fs::write(dir.join("routing.yaml"), routing).unwrap();
    let app = net.dir().join("app.py");
    std::fs::write(&app, APP).unwrap();
    std::fs::write(net.dir().join("client.py"), CLIENT).unwrap();
    for (name, _, env) in backends {
        let pod = &mut net.pods[index[name]];
        let mut env: Vec<(&str, &str)> = env.to_vec();
        env.push(("NAME", name));
        pod.spawn(
            "app",
            APP_UID,
            APP_UID,
            &env,
            &["/usr/bin/python3", app.to_str().unwrap()],
        )
        .unwrap();
    }
    before(&mut net);
    let names: Vec<&str> = std::iter::once("client")
        .chain(backends.iter().map(|b| b.0))
        .collect();
    for (i, name) in names.iter().enumerate() {
        if i != CLIENT_POD && backends[i - 1].1.is_empty() {
            continue;
        }
        let pod = &mut net.pods[i];
        harness::istio_iptables(pod, &[]).unwrap();
        let name = name.to_string();
        let ip = pod.ip.to_string();
        pod.spawn_embedded_agent(
            &dir,
            &[
                ("POD_NAME", &name),
                ("POD_NAMESPACE", NS),
                ("INSTANCE_IP", &ip),
                ("SERVICE_ACCOUNT", &name),
                ("PROXY_CONFIG", "{\"terminationDrainDuration\": \"0s\"}"),
            ],
        )
        .unwrap();
    }
    wait_ready(&net);
    let m = Mesh {
        net,
        dir,
        backends: index,
    };
    // Routes arrive just after listeners: wait until the mesh answers.
    assert!(
        wait_until(Duration::from_secs(20), || m.get("/status/200", 1, &[])[0]
            .code
            != 0),
        "{}",
        m.net.logs()
    );
    Some(m)
}

impl Mesh {
    pub fn client(&self) -> &Pod {
        &self.net.pods[CLIENT_POD]
    }

    /// Runs python3 with `args` in the client pod, as the app's uid.
    pub fn python(&self, args: &[&str]) -> std::process::Output {
        self.python_in(CLIENT_POD, args)
    }

    /// Runs python3 with `args` in pod `pod`, as the app's uid.
    pub fn python_in(&self, pod: usize, args: &[&str]) -> std::process::Output {
        let mut all = vec!["/usr/bin/python3"];
        all.extend_from_slice(args);
        self.net.pods[pod].exec_as(APP_UID, APP_UID, &all).unwrap()
    }

    /// One line exchange with the TCP service `lines`: the backend's name, or nothing when
    /// the connection is refused or closed.
    pub fn tcp_line(&self) -> String {
        let out = self.python(&[
            "-c",
            &format!(
                "import socket\ntry:\n s=socket.create_connection(('{TCP_VIP}',{TCP_PORT}),5);s.sendall(b'hi\\n');print(s.makefile().readline().strip())\nexcept OSError:\n print('')"
            ),
        ]);
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// `n` requests to `url` with `headers`, `workers` at a time, from the client pod.
    pub fn send(
        &self,
        url: &str,
        n: usize,
        headers: &[(&str, &str)],
        workers: usize,
    ) -> Vec<Reply> {
        self.send_from(CLIENT_POD, url, n, headers, workers)
    }

    /// `send` from pod `pod`.
    pub fn send_from(
        &self,
        pod: usize,
        url: &str,
        n: usize,
        headers: &[(&str, &str)],
        workers: usize,
    ) -> Vec<Reply> {
        let headers: BTreeMap<&str, &str> = headers.iter().copied().collect();
        let script = self.net.dir().join("client.py");
        let out = self.python_in(
            pod,
            &[
                script.to_str().unwrap(),
                url,
                &n.to_string(),
                &serde_json::to_string(&headers).unwrap(),
                &workers.to_string(),
            ],
        );
        let text = String::from_utf8_lossy(&out.stdout);
        let replies: Vec<Reply> = text
            .lines()
            .map(|l| {
                let mut words = l.splitn(3, ' ');
                let code = words.next().unwrap_or("0").parse().unwrap_or(0);
                let secs = words.next().unwrap_or("0").parse().unwrap_or(0.0);
                let mut rest = words.next().unwrap_or("").to_string();
                let overloaded = rest.starts_with("overloaded");
                if overloaded {
                    rest = rest
                        .trim_start_matches("overloaded")
                        .trim_start()
                        .to_string();
                }
                let mut location = None;
                if let Some(r) = rest.strip_prefix("location=") {
                    let (loc, tail) = r.split_once(' ').unwrap_or((r, ""));
                    location = Some(loc.to_string());
                    rest = tail.to_string();
                }
                Reply {
                    code,
                    secs,
                    overloaded,
                    location,
                    body: rest,
                }
            })
            .collect();
        assert_eq!(
            replies.len(),
            n,
            "client output: {text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        replies
    }

    pub fn get(&self, path: &str, n: usize, headers: &[(&str, &str)]) -> Vec<Reply> {
        self.send(&format!("http://{VIP}:{PORT}{path}"), n, headers, 1)
    }

    pub fn app_log(&self, backend: &str) -> String {
        self.net.pods[self.backends[backend]].logs_of("app")
    }

    /// Rewrites the routing file; returns once the client's Envoy has taken a new route
    /// configuration.
    pub fn edit_routing(&self, yaml: &str) {
        let stat = format!("http.outbound_0.0.0.0_{PORT}.rds.{PORT}.update_success");
        let before = self.client().envoy_stat(&stat).unwrap_or(0);
        std::fs::write(self.dir.join("routing.yaml"), yaml).unwrap();
        assert!(
            wait_until(Duration::from_secs(20), || {
                self.client().envoy_stat(&stat).unwrap_or(0) > before
            }),
            "route update not taken\n{}",
            self.net.logs()
        );
    }
}

pub fn count_by_instance(replies: &[Reply]) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for r in replies {
        *out.entry(format!("{} {}", r.code, r.instance()))
            .or_insert(0) += 1;
    }
    out
}

/// A test CA (a distinct subject, so its leaves never look self-signed): its PEM and the
/// issuer that signs leaves.
pub fn test_ca(name: &str) -> (String, rcgen::Issuer<'static, rcgen::KeyPair>) {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    let pem = params.self_signed(&key).unwrap().pem();
    (pem, rcgen::Issuer::new(params, key))
}

/// A leaf certificate for DNS name `name` signed by `issuer`: (certificate PEM, key PEM).
pub fn leaf_cert(issuer: &rcgen::Issuer<'static, rcgen::KeyPair>, name: &str) -> (String, String) {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(vec![name.to_string()]).unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    let cert = params.signed_by(&key, issuer).unwrap();
    (cert.pem(), key.serialize_pem())
}
