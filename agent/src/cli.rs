//! The `pilot-agent` command line, as Istio's (`pilot/cmd/pilot-agent`): `proxy` (the agent
//! beside Envoy), `istio-iptables` (capture, istio-init's flags), `wait`, `request` and
//! `version`. Istio's flags the injector may pass and this agent does not know are dropped
//! with a warning, as Istio's agent ignores them.

use std::path::PathBuf;

use crate::config::legacy_flags::LegacyFlags;
use crate::config::{Config, ProxyArgs, envoy_user, process_env};
use clap::{Parser, Subcommand};

/// Exit code for any error, as Istio's pilot-agent (`os.Exit(-1)`).
const ERROR_CODE: i32 = 255;

#[derive(Parser)]
#[command(
    name = "pilot-agent",
    about = "Istio-compatible sidecar agent",
    version
)]
struct Cli {
    /// Log levels, Istio style (e.g. default:info).
    #[arg(long = "log_output_level", global = true)]
    log_output_level: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
#[allow(clippy::large_enum_variant)] // parsed once at start
enum Command {
    /// Run Envoy and the agent (types: sidecar, router).
    Proxy {
        #[arg(default_value = "sidecar", value_parser = ["sidecar", "router"])]
        proxy_type: String,
        /// Embedded control plane: serve xDS from this config directory (default when set).
        #[arg(long = "configDir")]
        config_dir: Option<PathBuf>,
        #[arg(long)]
        domain: Option<String>,
        #[arg(long = "meshConfig", default_value = "./etc/istio/config/mesh")]
        mesh_config: PathBuf,
        #[arg(long = "serviceCluster")]
        service_cluster: Option<String>,
        #[arg(long = "proxyLogLevel", default_value = "warning")]
        proxy_log_level: String,
        #[arg(long = "proxyComponentLogLevel", default_value = "")]
        proxy_component_log_level: String,
        #[arg(long)]
        concurrency: Option<u32>,
        /// Accepted for compatibility; not used yet.
        #[arg(long = "stsPort")]
        sts_port: Option<u16>,
        #[arg(long = "tokenManagerPlugin")]
        token_manager_plugin: Option<String>,
        #[arg(long = "templateFile")]
        template_file: Option<String>,
        #[arg(long = "outlierLogPath")]
        outlier_log_path: Option<String>,
        #[arg(long, num_args = 0..=1, default_missing_value = "true")]
        profiling: Option<String>,
        /// Istio 1.5's injector flags; each sets its ProxyConfig field.
        #[command(flatten)]
        legacy: LegacyFlags,
    },
    /// Program iptables for traffic capture (same flags as istio-iptables).
    #[command(name = "istio-iptables", disable_help_flag = true)]
    IstioIptables {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Wait until the proxy is ready.
    Wait {
        #[arg(long, default_value = "http://localhost:15021/healthz/ready")]
        url: String,
        #[arg(long = "timeoutSeconds", default_value_t = 60)]
        timeout_seconds: u64,
        #[arg(long = "periodMillis", default_value_t = 500)]
        period_millis: u64,
    },
    /// Send an HTTP request to a local admin port (Envoy 15000 by default), as Istio's
    /// `pilot-agent request <method> <path> [body]`.
    Request {
        method: String,
        path: String,
        body: Option<String>,
        #[arg(long = "debug-port", default_value_t = 15000)]
        debug_port: u16,
    },
    /// Print the version.
    Version,
}

/// Ports `request` may talk to (Envoy admin, agent status, Envoy readiness, debug), as Istio's.
const REQUEST_PORTS: [u16; 4] = [15000, 15020, 15021, 15004];

async fn request(method: &str, path: &str, body: Option<String>, port: u16) -> anyhow::Result<()> {
    if !REQUEST_PORTS.contains(&port) {
        anyhow::bail!("--debug-port {port}: expected one of {REQUEST_PORTS:?}");
    }
    let method =
        hyper::Method::from_bytes(method.to_ascii_uppercase().as_bytes()).map_err(|_| {
            anyhow::anyhow!("method {method:?}: expected an HTTP method such as GET or POST")
        })?;
    let path = if path.starts_with('/') {
        path.to_string()
    } else {
        format!("/{path}")
    };
    let body = bytes::Bytes::from(body.unwrap_or_default());
    let (status, text) = tokio::time::timeout(
        std::time::Duration::from_secs(60),
        crate::admin::exchange(port, method, &path, body),
    )
    .await
    .map_err(|_| anyhow::anyhow!("no answer from localhost:{port} within 60s"))??;
    print!("{text}");
    if status > 399 && status != 404 {
        anyhow::bail!("localhost:{port}{path} answered {status}");
    }
    Ok(())
}

/// Istio's pilot-agent ignores flags it does not know (a newer injector may pass more). Drops
/// them from `proxy`'s arguments with a warning: `--x=y`, or `--x` and a value that follows it.
fn drop_unknown_proxy_flags(argv: Vec<String>) -> Vec<String> {
    use clap::CommandFactory;
    let cmd = Cli::command();
    let Some(proxy) = cmd.find_subcommand("proxy") else {
        return argv;
    };
    let known: Vec<String> = proxy
        .get_arguments()
        .chain(cmd.get_arguments())
        .filter_map(|a| a.get_long().map(|l| format!("--{l}")))
        .chain(["--help".to_string(), "-h".to_string()])
        .collect();
    if argv.get(1).map(String::as_str) != Some("proxy") {
        return argv;
    }
    let mut out = Vec::with_capacity(argv.len());
    let mut iter = argv.into_iter().peekable();
    while let Some(arg) = iter.next() {
        let name = arg.split('=').next().unwrap_or_default().to_string();
        if arg.starts_with("--") && !known.contains(&name) {
            eprintln!("pilot-agent: warning: ignoring unknown flag {name}");
            if !arg.contains('=') && iter.peek().is_some_and(|next| !next.starts_with('-')) {
                iter.next();
            }
            continue;
        }
        out.push(arg);
    }
    out
}

/// The config's view of `proxy`'s command line.
fn proxy_args(command: Command) -> Option<ProxyArgs> {
    let Command::Proxy {
        proxy_type,
        config_dir,
        domain,
        mesh_config,
        service_cluster,
        proxy_log_level,
        proxy_component_log_level,
        concurrency,
        template_file,
        legacy,
        ..
    } = command
    else {
        return None;
    };
    Some(ProxyArgs {
        proxy_type,
        domain,
        service_cluster,
        proxy_log_level,
        proxy_component_log_level,
        concurrency,
        config_dir,
        mesh_config: Some(mesh_config),
        pod_info_dir: Some(PathBuf::from("./etc/istio/pod")),
        template_file: template_file.map(PathBuf::from),
        resolv_conf: None,
        legacy,
    })
}

fn uid_of(user: &str) -> Option<u32> {
    nix::unistd::User::from_name(user)
        .ok()
        .flatten()
        .map(|u| u.uid.as_raw())
}

/// Started as root (VMs, tests), the agent takes the proxy's group as its effective group, as
/// Istio's VM package does with a setgid pilot-agent: its own connections (to the control plane,
/// upstream DNS) then match istio-iptables' `--gid-owner` bypass instead of being captured.
/// Done before any thread exists, so every thread has it.
fn run_with_proxy_gid() {
    if !nix::unistd::geteuid().is_root() {
        return;
    }
    let user = envoy_user(&process_env);
    let gid = nix::unistd::User::from_name(&user)
        .ok()
        .flatten()
        .map(|u| u.gid)
        .unwrap_or_else(|| nix::unistd::Gid::from_raw(1337));
    if let Err(e) = nix::unistd::setegid(gid) {
        eprintln!(
            "pilot-agent: warning: cannot take group {gid} ({e}); the agent's own traffic may be captured"
        );
    }
}

fn init_logging(level: Option<&str>) {
    // Istio's `scope:level` list; `default:<level>` becomes our default.
    let default = level
        .and_then(|l| {
            l.split(',')
                .find_map(|s| s.strip_prefix("default:").map(str::to_string))
        })
        .unwrap_or_else(|| "info".to_string());
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_new(&default)
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        // Colours for a terminal only: a log file or `kubectl logs` gets plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

async fn wait(url: &str, timeout: u64, period: u64) -> anyhow::Result<()> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| anyhow::anyhow!("--url {url:?}: expected http://host:port/path"))?;
    let (hostport, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let port: u16 = hostport
        .rsplit_once(':')
        .and_then(|(_, p)| p.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("--url {url:?}: expected an explicit port"))?;
    // A timeout too large for the clock waits for ever, as the caller asked.
    let deadline = std::time::Instant::now().checked_add(std::time::Duration::from_secs(timeout));
    loop {
        match crate::admin::get(port, if path.is_empty() { "/" } else { path }).await {
            Ok(_) => return Ok(()),
            Err(e) if deadline.is_some_and(|d| std::time::Instant::now() >= d) => {
                anyhow::bail!("timed out after {timeout}s waiting for {url}: {e}")
            }
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(period)).await,
        }
    }
}

/// glibc's malloc keeps what a large message freed: its mmap threshold rises to the largest
/// block freed, so the next large blocks come from the heap, which it trims only past 128 KiB
/// free at its top. An agent that passed a 1000-service push through held about a megabyte more
/// for good (BENCHMARKS.md "pilot-agent beside Istio's"). Fixed thresholds of 64 KiB hand large
/// blocks back as soon as they are freed.
fn return_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt(3) only sets allocator parameters, under glibc's own lock.
    #[allow(unsafe_code)]
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 64 * 1024);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 64 * 1024);
    }
}

/// The `pilot-agent` command: `argv` as the process was given it; returns the exit code.
pub fn main(argv: Vec<String>) -> i32 {
    let cli = Cli::parse_from(drop_unknown_proxy_flags(argv));
    if let Command::IstioIptables { args } = &cli.command {
        let mut argv = vec!["istio-iptables".to_string()];
        argv.extend(args.iter().cloned());
        if let Some(l) = &cli.log_output_level {
            argv.push(format!("--log_output_level={l}"));
        }
        let code = match <istio_init::config::Args as Parser>::try_parse_from(argv) {
            Ok(a) => istio_init::cli::main(a, &process_env, &uid_of),
            Err(e) => {
                let _ = e.print();
                if e.use_stderr() { ERROR_CODE } else { 0 }
            }
        };
        return code;
    }
    init_logging(cli.log_output_level.as_deref());
    if matches!(cli.command, Command::Proxy { .. }) {
        run_with_proxy_gid();
        return_freed_memory();
    }
    // One thread: the agent's work is I/O between Envoy and the control plane, and a single
    // thread keeps one malloc arena, so memory freed after a large push is reused.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("pilot-agent: cannot start the runtime: {e}");
            return ERROR_CODE;
        }
    };
    let result: anyhow::Result<()> = runtime.block_on(async {
        match cli.command {
            Command::Proxy { .. } => {
                let Some(args) = proxy_args(cli.command) else {
                    return Ok(());
                };
                let cfg = Config::from_process_env(&args, &uid_of)?;
                crate::run(cfg).await?;
                Ok(())
            }
            Command::Wait {
                url,
                timeout_seconds,
                period_millis,
            } => wait(&url, timeout_seconds, period_millis).await,
            Command::Request {
                method,
                path,
                body,
                debug_port,
            } => request(&method, &path, body, debug_port).await,
            Command::Version => {
                println!("pilot-agent {}", env!("CARGO_PKG_VERSION"));
                Ok(())
            }
            Command::IstioIptables { .. } => Ok(()),
        }
    });
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("pilot-agent: {e}");
            ERROR_CODE
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::config::{ControlPlaneSource, Inputs};

    use super::*;

    /// The istio-proxy args of Istio 1.5's injector (a `kubectl describe pod` of a 1.5.0 pod),
    /// with `$(POD_NAMESPACE)` expanded as kubelet does.
    const ISTIO_1_5_ARGV: &str = "pilot-agent proxy sidecar --domain default.svc.cluster.local \
        --configPath /etc/istio/proxy --binaryPath /usr/local/bin/envoy \
        --serviceCluster sidecar-test.default --drainDuration 45s --parentShutdownDuration 1m0s \
        --discoveryAddress istiod.istio-system.svc:15012 --zipkinAddress zipkin.istio-system:9411 \
        --proxyLogLevel=warning --proxyComponentLogLevel=misc:error --connectTimeout 10s \
        --proxyAdminPort 15000 --concurrency 2 --controlPlaneAuthPolicy NONE \
        --dnsRefreshRate 300s --statusPort 15020 --trust-domain=cluster.local \
        --controlPlaneBootstrap=false";

    fn parse(argv: &str) -> Result<Config, crate::config::ConfigError> {
        let argv: Vec<String> = argv.split_whitespace().map(String::from).collect();
        let kept = drop_unknown_proxy_flags(argv.clone());
        assert_eq!(kept, argv, "a flag was dropped as unknown");
        let args = proxy_args(Cli::try_parse_from(kept).unwrap().command).unwrap();
        let inputs = Inputs {
            labels: None,
            annotations: None,
            mesh_config: None,
            resolv_conf: Ok(None),
            mounted_certs: Default::default(),
        };
        let env: Vec<(String, String)> = [
            ("POD_NAME", "sidecar-test"),
            ("POD_NAMESPACE", "default"),
            ("INSTANCE_IP", "10.1.1.84"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let lookup = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        Config::parse(&args, &inputs, &lookup, &env, &|_| None)
    }

    #[test]
    fn istio_1_5_injector_argv_sets_proxy_config() {
        let c = parse(ISTIO_1_5_ARGV).unwrap();
        assert_eq!(c.proxy_type, "sidecar");
        assert_eq!(c.dns_domain, "default.svc.cluster.local");
        assert_eq!(c.config_path, PathBuf::from("/etc/istio/proxy"));
        assert_eq!(c.binary_path, PathBuf::from("/usr/local/bin/envoy"));
        assert_eq!(c.service_cluster, "sidecar-test.default");
        assert_eq!(c.drain_duration, Duration::from_secs(45));
        assert_eq!(c.proxy_config_json["parentShutdownDuration"], "60s");
        assert_eq!(
            c.control_plane,
            ControlPlaneSource::Remote {
                address: "istiod.istio-system.svc:15012".into()
            }
        );
        assert_eq!(
            c.zipkin_address.as_deref(),
            Some("zipkin.istio-system:9411")
        );
        assert_eq!(c.proxy_log_level, "warning");
        assert_eq!(c.proxy_component_log_level, "misc:error");
        assert_eq!(c.connect_timeout, Some(Duration::from_secs(10)));
        assert_eq!(c.admin_port, 15000);
        assert_eq!(c.concurrency, Some(2));
        assert_eq!(c.dns_refresh_rate, Duration::from_secs(300));
        assert_eq!(c.status_port, 15020);
        assert_eq!(c.identity.identity.trust_domain, "cluster.local");
        let xds = c.xds_client.unwrap();
        // NONE, but 15012 is istiod's TLS-only port: Istio 1.5 dialled it over TLS too.
        assert!(xds.tls);
        assert_eq!(xds.connect_timeout, Duration::from_secs(10));
        assert_eq!(c.proxy_config_json["controlPlaneAuthPolicy"], "NONE");
        assert_eq!(
            c.proxy_config_json["tracing"]["zipkin"]["address"],
            "zipkin.istio-system:9411"
        );

        // The same argv with other values: each flag reaches its field.
        let c = parse(
            &ISTIO_1_5_ARGV
                .replace("/etc/istio/proxy", "/var/lib/proxy")
                .replace("/usr/local/bin/envoy", "/opt/envoy")
                .replace("--drainDuration 45s", "--drainDuration 7s")
                .replace("1m0s", "1m30s")
                .replace("istiod.istio-system.svc:15012", "10.0.0.9:15011")
                .replace("zipkin.istio-system:9411", "10.0.0.7:9411")
                .replace("--connectTimeout 10s", "--connectTimeout 250ms")
                .replace("--proxyAdminPort 15000", "--proxyAdminPort 15100")
                .replace("--concurrency 2", "--concurrency 3")
                .replace("--dnsRefreshRate 300s", "--dnsRefreshRate 30s")
                .replace("--statusPort 15020", "--statusPort 15120")
                .replace("--trust-domain=cluster.local", "--trust-domain=example.org"),
        )
        .unwrap();
        assert_eq!(c.config_path, PathBuf::from("/var/lib/proxy"));
        assert_eq!(c.binary_path, PathBuf::from("/opt/envoy"));
        assert_eq!(c.drain_duration, Duration::from_secs(7));
        assert_eq!(c.proxy_config_json["parentShutdownDuration"], "90s");
        assert_eq!(
            c.control_plane,
            ControlPlaneSource::Remote {
                address: "10.0.0.9:15011".into()
            }
        );
        assert_eq!(c.zipkin_address.as_deref(), Some("10.0.0.7:9411"));
        assert_eq!(c.connect_timeout, Some(Duration::from_millis(250)));
        assert_eq!(c.admin_port, 15100);
        assert_eq!(c.concurrency, Some(3));
        assert_eq!(c.dns_refresh_rate, Duration::from_secs(30));
        assert_eq!(c.status_port, 15120);
        assert_eq!(c.identity.identity.trust_domain, "example.org");
        // NONE on another port: plaintext.
        assert!(!c.xds_client.unwrap().tls);
    }

    #[test]
    fn a_bad_legacy_flag_is_named_with_its_value() {
        for (from, to, flag) in [
            (
                "--drainDuration 45s",
                "--drainDuration 45",
                "--drainDuration",
            ),
            ("1m0s", "NaNs", "--parentShutdownDuration"),
            (
                "--connectTimeout 10s",
                "--connectTimeout 9999999999999999h",
                "--connectTimeout",
            ),
            (
                "--proxyAdminPort 15000",
                "--proxyAdminPort 70000",
                "--proxyAdminPort",
            ),
            ("--statusPort 15020", "--statusPort x", "--statusPort"),
            ("NONE", "TLS", "--controlPlaneAuthPolicy"),
            (
                "--dnsRefreshRate 300s",
                "--dnsRefreshRate 0s",
                "--dnsRefreshRate",
            ),
            (
                "istiod.istio-system.svc:15012",
                "istiod",
                "--discoveryAddress",
            ),
            ("zipkin.istio-system:9411", "zipkin", "--zipkinAddress"),
            (
                "--controlPlaneBootstrap=false",
                "--controlPlaneBootstrap=maybe",
                "--controlPlaneBootstrap",
            ),
            (
                "--trust-domain=cluster.local",
                "--trust-domain=a/b",
                "--trust-domain",
            ),
        ] {
            let argv = ISTIO_1_5_ARGV.replace(from, to);
            let e = parse(&argv).unwrap_err();
            assert!(e.input.starts_with(flag), "{to}: {e}");
            let bad = to.rsplit([' ', '=']).next().unwrap();
            assert!(e.to_string().contains(bad), "{to}: {e}");
        }
        // Istio 1.5 rendered --templateFile as a Go template when controlPlaneBootstrap was true.
        let e = parse(&format!(
            "{} --templateFile /t.yaml",
            ISTIO_1_5_ARGV.replace("--controlPlaneBootstrap=false", "--controlPlaneBootstrap")
        ))
        .unwrap_err();
        assert_eq!(e.input, "--controlPlaneBootstrap");
    }
}
