//! The typed configuration of istio-iptables, parsed once at the edge.
//!
//! Mirrors Istio's `tools/istio-iptables/pkg/cmd/root.go` and `tools/common/config`: every flag keeps
//! its short and long name, and each flag that Istio binds to an env var reads it here, with the
//! precedence command line > env > default. Unlike Istio, every value is validated before anything
//! touches the kernel; a bad value names the flag (or env var), the value and what was expected.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use clap::Parser;

/// Env var names that are not bound to a flag (Istio's `constants.go`).
pub mod env {
    pub const OUTBOUND_IPV4_LOOPBACK_CIDR: &str = "ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR";
    pub const OUTBOUND_OWNER_GROUPS: &str = "ISTIO_OUTBOUND_OWNER_GROUPS";
    pub const OUTBOUND_OWNER_GROUPS_EXCLUDE: &str = "ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE";
    pub const ENVOY_USER: &str = "ENVOY_USER";
}

/// Command-line flags exactly as Istio's istio-iptables names them. Every value is an `Option`
/// so that an unset flag can fall back to its env var, then to the default.
#[derive(Debug, Default, Parser)]
#[command(
    name = "istio-iptables",
    // A repeated flag takes its last value, as Istio's (pflag) does.
    args_override_self = true,
    about = "Set up iptables rules so that a pod's TCP traffic is captured by Envoy (Istio-compatible).",
    long_about = "Set up iptables rules so that a pod's TCP traffic is captured by Envoy.\n\n\
        Accepts the flags and env vars of Istio's istio-iptables (command line > env var > default). \
        All rules of one IP family are applied with a single `iptables-restore --noflush`, so a rejected \
        payload leaves the kernel unchanged. Exit codes: 0 ok, 1 bad config or apply failure, \
        126 validation failed, 255 unparseable command line."
)]
pub struct Args {
    /// Envoy outbound capture port (no env var, as in Istio).
    #[arg(short = 'p', long = "envoy-port")]
    pub envoy_port: Option<String>,
    /// Port to which inbound TCP traffic is redirected [env: INBOUND_CAPTURE_PORT, default 15006].
    #[arg(short = 'z', long = "inbound-capture-port")]
    pub inbound_capture_port: Option<String>,
    /// HBONE tunnel port, never captured [env: INBOUND_TUNNEL_PORT, default 15008].
    #[arg(short = 'e', long = "inbound-tunnel-port")]
    pub inbound_tunnel_port: Option<String>,
    /// Comma list of uids whose traffic bypasses capture [env: PROXY_UID, default uid of $ENVOY_USER or 1337].
    #[arg(short = 'u', long = "proxy-uid")]
    pub proxy_uid: Option<String>,
    /// Comma list of gids whose traffic bypasses capture [env: PROXY_GID, default = uids].
    #[arg(short = 'g', long = "proxy-gid")]
    pub proxy_gid: Option<String>,
    /// Inbound interception mode: REDIRECT or TPROXY [env: ISTIO_INBOUND_INTERCEPTION_MODE].
    #[arg(short = 'm', long = "istio-inbound-interception-mode")]
    pub inbound_interception_mode: Option<String>,
    /// Inbound ports (or ranges such as 3000:3010) to capture, or '*' for all [env: ISTIO_INBOUND_PORTS].
    #[arg(short = 'b', long = "istio-inbound-ports")]
    pub inbound_ports: Option<String>,
    /// Inbound ports (or ranges) excluded when -b is '*' [env: ISTIO_LOCAL_EXCLUDE_PORTS].
    #[arg(short = 'd', long = "istio-local-exclude-ports")]
    pub local_exclude_ports: Option<String>,
    /// Interfaces whose traffic is never captured [env: ISTIO_EXCLUDE_INTERFACES].
    #[arg(short = 'c', long = "istio-exclude-interfaces")]
    pub exclude_interfaces: Option<String>,
    /// Outbound destination CIDRs to capture, or '*' [env: ISTIO_SERVICE_CIDR].
    #[arg(short = 'i', long = "istio-service-cidr")]
    pub service_cidr: Option<String>,
    /// Outbound destination CIDRs never captured [env: ISTIO_SERVICE_EXCLUDE_CIDR].
    #[arg(short = 'x', long = "istio-service-exclude-cidr")]
    pub service_exclude_cidr: Option<String>,
    /// Outbound ports (or ranges) always captured [env: ISTIO_OUTBOUND_PORTS].
    #[arg(short = 'q', long = "istio-outbound-ports")]
    pub outbound_ports: Option<String>,
    /// Outbound ports (or ranges such as 3000:3010) never captured, TCP and UDP [env: ISTIO_LOCAL_OUTBOUND_PORTS_EXCLUDE].
    #[arg(short = 'o', long = "istio-local-outbound-ports-exclude")]
    pub local_outbound_ports_exclude: Option<String>,
    /// Virtual interfaces (e.g. KubeVirt) whose inbound traffic is treated as outbound [env: KUBE_VIRT_INTERFACES].
    #[arg(short = 'k', long = "kube-virt-interfaces")]
    pub kube_virt_interfaces: Option<String>,
    /// TPROXY mark [env: ISTIO_INBOUND_TPROXY_MARK, default 1337].
    #[arg(short = 't', long = "istio-inbound-tproxy-mark")]
    pub tproxy_mark: Option<String>,
    /// TPROXY routing table [env: ISTIO_INBOUND_TPROXY_ROUTE_TABLE, default 133].
    #[arg(short = 'r', long = "istio-inbound-tproxy-route-table")]
    pub tproxy_route_table: Option<String>,
    /// Print the iptables-restore payloads and change nothing [env: DRY_RUN].
    #[arg(short = 'n', long = "dry-run", num_args = 0..=1, default_missing_value = "true")]
    pub dry_run: Option<String>,
    /// Port used by --run-validation [env: IPTABLES_PROBE_PORT, default 15002].
    #[arg(long = "iptables-probe-port")]
    pub iptables_probe_port: Option<String>,
    /// Timeout of --run-validation [env: PROBE_TIMEOUT, default 5s].
    #[arg(long = "probe-timeout")]
    pub probe_timeout: Option<String>,
    /// Do not apply rules (used with --run-validation) [env: SKIP_RULE_APPLY].
    #[arg(long = "skip-rule-apply", num_args = 0..=1, default_missing_value = "true")]
    pub skip_rule_apply: Option<String>,
    /// Check that redirection works; exit 126 if not [env: RUN_VALIDATION].
    #[arg(long = "run-validation", num_args = 0..=1, default_missing_value = "true")]
    pub run_validation: Option<String>,
    /// Capture DNS to the agent on 15053 [env: ISTIO_META_DNS_CAPTURE, else REDIRECT_DNS].
    #[arg(long = "redirect-dns", num_args = 0..=1, default_missing_value = "true")]
    pub redirect_dns: Option<String>,
    /// Capture all DNS, not only to resolv.conf servers [env: CAPTURE_ALL_DNS].
    #[arg(long = "capture-all-dns", num_args = 0..=1, default_missing_value = "true")]
    pub capture_all_dns: Option<String>,
    /// Drop packets in conntrack state INVALID [env: INVALID_DROP, else DROP_INVALID].
    #[arg(long = "drop-invalid", num_args = 0..=1, default_missing_value = "true")]
    pub drop_invalid: Option<String>,
    /// Accepted as Istio's; IPv6 rules follow the pod's addresses: added when it has a global
    /// IPv6 address, with or without this flag [env: ISTIO_DUAL_STACK, else DUAL_STACK].
    #[arg(long = "dual-stack", num_args = 0..=1, default_missing_value = "true")]
    pub dual_stack: Option<String>,
    /// Network namespace to enter before applying [env: NETWORK_NAMESPACE].
    #[arg(long = "network-namespace")]
    pub network_namespace: Option<String>,
    /// Reconcile differing existing rules [env: RECONCILE].
    #[arg(long = "reconcile", num_args = 0..=1, default_missing_value = "true")]
    pub reconcile: Option<String>,
    /// Remove our chains and jumps and exit [env: CLEANUP_ONLY].
    #[arg(long = "cleanup-only", num_args = 0..=1, default_missing_value = "true")]
    pub cleanup_only: Option<String>,
    /// Apply even when the rules are already in place [env: FORCE_APPLY].
    #[arg(long = "force-apply", num_args = 0..=1, default_missing_value = "true")]
    pub force_apply: Option<String>,
    /// Force the iptables backend: legacy or nft [env: FORCE_IPTABLES_BINARY].
    #[arg(long = "force-iptables-binary")]
    pub force_iptables_binary: Option<String>,
    /// Program Istio's nftables tables (inet istio-proxy-nat, -mangle, -raw) through `nft`
    /// instead of iptables rules [env: NATIVE_NFTABLES].
    #[arg(long = "native-nftables", num_args = 0..=1, default_missing_value = "true")]
    pub native_nftables: Option<String>,
    /// Log levels, Istio style (e.g. default:info); accepted for compatibility.
    #[arg(long = "log_output_level")]
    pub log_output_level: Option<String>,
    /// Istio's JSON logs (the injector passes it with `global.logAsJson`); accepted for
    /// compatibility, logs stay plain lines on stderr.
    #[arg(long = "log_as_json", num_args = 0..=1, default_missing_value = "true")]
    pub log_as_json: Option<String>,
    /// Istio's log destinations; accepted for compatibility, logs go to stderr.
    #[arg(long = "log_target", action = clap::ArgAction::Append)]
    pub log_target: Vec<String>,
    /// Istio's per-scope caller information; accepted for compatibility.
    #[arg(long = "log_caller")]
    pub log_caller: Option<String>,
    /// Istio's per-scope stack-trace levels; accepted for compatibility.
    #[arg(long = "log_stacktrace_level")]
    pub log_stacktrace_level: Option<String>,
    /// Istio's klog verbosity; accepted for compatibility.
    #[arg(long = "vklog")]
    pub vklog: Option<String>,
}

/// A validated configuration error: which input, what value, what was expected.
#[derive(Debug, thiserror::Error)]
#[error("invalid {input} {value:?}: expected {expected}")]
pub struct ConfigError {
    pub input: String,
    pub value: String,
    pub expected: String,
}

/// Inbound interception mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InterceptionMode {
    Redirect,
    Tproxy,
}

/// One item of a port list: a port, or an inclusive range `first:last` as iptables' `--dport`
/// takes it (Istio passes list items to iptables as written, so VM env files use ranges).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct PortRange {
    pub first: u16,
    /// The end of a range; `None` for a single port.
    pub last: Option<u16>,
}

impl From<u16> for PortRange {
    fn from(port: u16) -> PortRange {
        PortRange {
            first: port,
            last: None,
        }
    }
}

impl std::fmt::Display for PortRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.last {
            Some(last) => write!(f, "{}:{last}", self.first),
            None => write!(f, "{}", self.first),
        }
    }
}

/// As written (`15020`, `3000:3010`), so the config logged at start reads as the flags did.
impl std::fmt::Debug for PortRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

/// Which inbound ports are captured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InboundPorts {
    None,
    /// All ports, minus the excluded ones.
    All {
        exclude: Vec<PortRange>,
    },
    Only(Vec<PortRange>),
}

/// Which outbound destinations are captured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OutboundCidrs {
    None,
    All,
    Only(Vec<Cidr>),
}

/// Which backend binaries to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForcedBinary {
    Legacy,
    Nft,
}

/// An IP network in CIDR notation, host bits allowed as iptables allows them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    pub addr: IpAddr,
    pub prefix: u8,
}

impl Cidr {
    pub fn is_v4(&self) -> bool {
        self.addr.is_ipv4()
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub proxy_port: u16,
    pub inbound_capture_port: u16,
    pub inbound_tunnel_port: u16,
    pub proxy_uids: Vec<u32>,
    pub proxy_gids: Vec<u32>,
    pub mode: InterceptionMode,
    pub inbound: InboundPorts,
    pub exclude_interfaces: Vec<String>,
    pub outbound: OutboundCidrs,
    pub outbound_exclude_cidrs: Vec<Cidr>,
    pub outbound_ports: Vec<PortRange>,
    pub outbound_exclude_ports: Vec<PortRange>,
    pub kube_virt_interfaces: Vec<String>,
    pub tproxy_mark: u32,
    pub tproxy_route_table: u32,
    pub dry_run: bool,
    pub probe_port: u16,
    pub probe_timeout: Duration,
    pub skip_rule_apply: bool,
    pub run_validation: bool,
    pub redirect_dns: bool,
    pub capture_all_dns: bool,
    pub drop_invalid: bool,
    /// Parsed for Istio's sake; the IP families follow the pod's addresses (`crate::families`).
    pub dual_stack: bool,
    pub network_namespace: Option<String>,
    pub reconcile: bool,
    pub cleanup_only: bool,
    pub force_apply: bool,
    pub force_binary: Option<ForcedBinary>,
    /// `--native-nftables`: the plan is rendered as one `nft -f` transaction (`crate::nft`).
    pub native_nftables: bool,
    pub loopback_cidr_v4: Cidr,
    pub owner_groups_include: Option<Vec<String>>,
    pub owner_groups_exclude: Vec<String>,
}

/// A value taken from the command line or an env var, remembering which, for error messages.
struct Input {
    name: String,
    value: String,
}

fn err(input: &Input, expected: &str) -> ConfigError {
    ConfigError {
        input: input.name.clone(),
        value: input.value.clone(),
        expected: expected.to_string(),
    }
}

/// A port: decimal digits without a leading zero, 1..=65535.
fn parse_port(input: &Input, raw: &str) -> Result<u16, ConfigError> {
    let raw = raw.trim();
    let ok = !raw.is_empty() && raw.bytes().all(|b| b.is_ascii_digit()) && !raw.starts_with('0');
    match raw.parse::<u16>() {
        Ok(p) if ok && p > 0 => Ok(p),
        _ => Err(err(input, "a port number 1-65535")),
    }
}

/// A port list item: a port, or a range `first:last` with first <= last.
fn parse_port_range(input: &Input, raw: &str) -> Result<PortRange, ConfigError> {
    let Some((first, last)) = raw.split_once(':') else {
        return parse_port(input, raw).map(PortRange::from);
    };
    let bad = || err(input, "ports 1-65535 or ranges first:last of them");
    let first = parse_port(input, first).map_err(|_| bad())?;
    let last = parse_port(input, last).map_err(|_| bad())?;
    if first > last {
        return Err(bad());
    }
    Ok(PortRange {
        first,
        last: Some(last),
    })
}

fn parse_port_list(input: &Input) -> Result<Vec<PortRange>, ConfigError> {
    split_list(&input.value)
        .map(|p| parse_port_range(input, p))
        .collect()
}

fn split_list(s: &str) -> impl Iterator<Item = &str> {
    s.split(',').map(str::trim).filter(|p| !p.is_empty())
}

/// Go's `strconv.ParseBool` (pflag and viper read Istio's boolean flags and env vars with it); an
/// empty value is false.
fn parse_bool(input: &Input) -> Result<bool, ConfigError> {
    if input.value.is_empty() {
        return Ok(false);
    }
    mesh_common::parse_go_bool(&input.value).ok_or_else(|| {
        err(
            input,
            &format!("a boolean: {}", mesh_common::GO_BOOL_VALUES),
        )
    })
}

fn parse_id_list(input: &Input) -> Result<Vec<u32>, ConfigError> {
    let ids: Result<Vec<u32>, _> = split_list(&input.value)
        .map(|p| {
            if p.bytes().all(|b| b.is_ascii_digit()) {
                p.parse::<u32>().map_err(|_| ())
            } else {
                Err(())
            }
        })
        .collect();
    match ids {
        Ok(ids) if !ids.is_empty() => Ok(ids),
        _ => Err(err(input, "a comma-separated list of numeric ids")),
    }
}

/// Parses `a.b.c.d/n` or `x::y/n`; a bare address means a host route.
pub fn parse_cidr(raw: &str) -> Option<Cidr> {
    let (addr, prefix) = match raw.split_once('/') {
        Some((a, p)) => (a, Some(p)),
        None => (raw, None),
    };
    let addr: IpAddr = addr.parse().ok()?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    let prefix = match prefix {
        None => max,
        Some(p) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) && p.len() <= 3 => {
            p.parse::<u8>().ok()?
        }
        Some(_) => return None,
    };
    (prefix <= max).then_some(Cidr { addr, prefix })
}

fn parse_cidr_list(input: &Input) -> Result<Vec<Cidr>, ConfigError> {
    split_list(&input.value)
        .map(|c| parse_cidr(c).ok_or_else(|| err(input, "a comma-separated list of CIDRs")))
        .collect()
}

/// Linux interface names: 1-15 bytes, no '/', ':' or whitespace, and not starting with '-'
/// (so a name can never be read as an iptables option).
fn parse_interfaces(input: &Input) -> Result<Vec<String>, ConfigError> {
    split_list(&input.value)
        .map(|name| {
            let ok = name.len() <= 15
                && !name.starts_with('-')
                && name
                    .bytes()
                    .all(|b| b.is_ascii_graphic() && b != b'/' && b != b':' && b != b'"');
            if ok {
                Ok(name.to_string())
            } else {
                Err(err(
                    input,
                    "interface names of 1-15 printable characters without '/', ':' or a leading '-'",
                ))
            }
        })
        .collect()
}

fn parse_duration(input: &Input) -> Result<Duration, ConfigError> {
    mesh_common::parse_go_duration(&input.value)
        .map_err(|e| err(input, &format!("a duration such as 5s or 500ms ({e})")))
}

fn parse_u32(input: &Input) -> Result<u32, ConfigError> {
    input
        .value
        .trim()
        .parse()
        .map_err(|_| err(input, "a non-negative integer"))
}

/// Owner group names or numeric gids: the characters `groupadd` allows.
fn parse_groups(input: &Input) -> Result<Vec<String>, ConfigError> {
    let groups: Vec<String> = split_list(&input.value).map(str::to_string).collect();
    let valid = groups.iter().all(|g| {
        g.len() <= 32
            && !g.starts_with('-')
            && g.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
    });
    if !valid {
        return Err(err(input, "a comma-separated list of group names or gids"));
    }
    if groups.len() > 64 {
        return Err(err(input, "at most 64 groups"));
    }
    Ok(groups)
}

/// Where a value comes from: the command line first, then the env vars bound to its flag (through
/// `lookup`, so tests never touch the process environment).
struct Sources<'a> {
    lookup: &'a dyn Fn(&str) -> Option<String>,
}

impl Sources<'_> {
    /// The flag `--long` if given, else the first of `envs` that is set. Where Istio binds two
    /// env vars to a flag, its additional one (e.g. ISTIO_META_DNS_CAPTURE) wins when both are
    /// set, so it is listed first.
    fn get(&self, cli: &Option<String>, long: &str, envs: &[&str]) -> Option<Input> {
        if let Some(v) = cli {
            return Some(Input {
                name: format!("--{long}"),
                value: v.clone(),
            });
        }
        envs.iter().find_map(|e| self.env(e))
    }

    /// An env var on its own (Istio binds some to no flag).
    fn env(&self, name: &str) -> Option<Input> {
        (self.lookup)(name).map(|value| Input {
            name: format!("env {name}"),
            value,
        })
    }

    fn flag(&self, cli: &Option<String>, long: &str, envs: &[&str]) -> Result<bool, ConfigError> {
        self.get(cli, long, envs)
            .map_or(Ok(false), |i| parse_bool(&i))
    }

    fn port(
        &self,
        cli: &Option<String>,
        long: &str,
        envs: &[&str],
        default: u16,
    ) -> Result<u16, ConfigError> {
        self.get(cli, long, envs)
            .map_or(Ok(default), |i| parse_port(&i, &i.value))
    }

    fn ports(
        &self,
        cli: &Option<String>,
        long: &str,
        env: &str,
    ) -> Result<Vec<PortRange>, ConfigError> {
        self.get(cli, long, &[env])
            .map_or(Ok(Vec::new()), |i| parse_port_list(&i))
    }

    fn interfaces(
        &self,
        cli: &Option<String>,
        long: &str,
        env: &str,
    ) -> Result<Vec<String>, ConfigError> {
        self.get(cli, long, &[env])
            .map_or(Ok(Vec::new()), |i| parse_interfaces(&i))
    }

    fn number(
        &self,
        cli: &Option<String>,
        long: &str,
        env: &str,
        default: u32,
    ) -> Result<u32, ConfigError> {
        self.get(cli, long, &[env])
            .map_or(Ok(default), |i| parse_u32(&i))
    }
}

/// The uids and gids whose traffic bypasses capture: `-u`, else the uid of `$ENVOY_USER`
/// (istio-proxy), else 1337; `-g`, else the uids.
fn proxy_owners(
    src: &Sources,
    args: &Args,
    user_uid: &dyn Fn(&str) -> Option<u32>,
) -> Result<(Vec<u32>, Vec<u32>), ConfigError> {
    let uids = match src.get(&args.proxy_uid, "proxy-uid", &["PROXY_UID"]) {
        Some(i) if !i.value.trim().is_empty() => parse_id_list(&i)?,
        _ => {
            let user = (src.lookup)(env::ENVOY_USER).unwrap_or_else(|| "istio-proxy".to_string());
            vec![user_uid(&user).unwrap_or(1337)]
        }
    };
    let gids = match src.get(&args.proxy_gid, "proxy-gid", &["PROXY_GID"]) {
        Some(i) if !i.value.trim().is_empty() => parse_id_list(&i)?,
        _ => uids.clone(),
    };
    Ok((uids, gids))
}

fn interception_mode(src: &Sources, args: &Args) -> Result<InterceptionMode, ConfigError> {
    match src.get(
        &args.inbound_interception_mode,
        "istio-inbound-interception-mode",
        &["ISTIO_INBOUND_INTERCEPTION_MODE"],
    ) {
        None => Ok(InterceptionMode::Redirect),
        Some(i) => match i.value.as_str() {
            "" | "REDIRECT" => Ok(InterceptionMode::Redirect),
            "TPROXY" => Ok(InterceptionMode::Tproxy),
            _ => Err(err(&i, "REDIRECT or TPROXY")),
        },
    }
}

/// `-b` (none, '*' or a list), with `-d` excluded when it is '*'.
fn inbound_ports(src: &Sources, args: &Args) -> Result<InboundPorts, ConfigError> {
    let exclude = match src.get(
        &args.local_exclude_ports,
        "istio-local-exclude-ports",
        &["ISTIO_LOCAL_EXCLUDE_PORTS"],
    ) {
        Some(i) => parse_port_list(&i)?,
        None => Vec::new(),
    };
    Ok(
        match src.get(
            &args.inbound_ports,
            "istio-inbound-ports",
            &["ISTIO_INBOUND_PORTS"],
        ) {
            None => InboundPorts::None,
            Some(i) if i.value.trim().is_empty() => InboundPorts::None,
            Some(i) if i.value.trim() == "*" => InboundPorts::All { exclude },
            Some(i) => InboundPorts::Only(parse_port_list(&i)?),
        },
    )
}

/// `-i` (none, '*' or a list) and `-x` (a list; '*' is refused).
fn outbound_cidrs(src: &Sources, args: &Args) -> Result<(OutboundCidrs, Vec<Cidr>), ConfigError> {
    let include = match src.get(
        &args.service_cidr,
        "istio-service-cidr",
        &["ISTIO_SERVICE_CIDR"],
    ) {
        None => OutboundCidrs::None,
        Some(i) if i.value.trim().is_empty() => OutboundCidrs::None,
        Some(i) if i.value.trim() == "*" => OutboundCidrs::All,
        Some(i) => OutboundCidrs::Only(parse_cidr_list(&i)?),
    };
    let exclude = match src.get(
        &args.service_exclude_cidr,
        "istio-service-exclude-cidr",
        &["ISTIO_SERVICE_EXCLUDE_CIDR"],
    ) {
        Some(i) if i.value.trim() == "*" => {
            return Err(err(&i, "a list of CIDRs ('*' would disable all capture)"));
        }
        Some(i) => parse_cidr_list(&i)?,
        None => Vec::new(),
    };
    Ok((include, exclude))
}

/// TPROXY's packet mark (1337) and policy routing table (133).
fn tproxy_routing(src: &Sources, args: &Args) -> Result<(u32, u32), ConfigError> {
    let mark = src.number(
        &args.tproxy_mark,
        "istio-inbound-tproxy-mark",
        "ISTIO_INBOUND_TPROXY_MARK",
        1337,
    )?;
    let route_table = src.number(
        &args.tproxy_route_table,
        "istio-inbound-tproxy-route-table",
        "ISTIO_INBOUND_TPROXY_ROUTE_TABLE",
        133,
    )?;
    Ok((mark, route_table))
}

/// `--run-validation`'s probe port (15002) and timeout (5s).
fn validation_probe(src: &Sources, args: &Args) -> Result<(u16, Duration), ConfigError> {
    let port = src.port(
        &args.iptables_probe_port,
        "iptables-probe-port",
        &["IPTABLES_PROBE_PORT"],
        15002,
    )?;
    let timeout = src
        .get(&args.probe_timeout, "probe-timeout", &["PROBE_TIMEOUT"])
        .map_or(Ok(Duration::from_secs(5)), |i| parse_duration(&i))?;
    Ok((port, timeout))
}

fn forced_binary(src: &Sources, args: &Args) -> Result<Option<ForcedBinary>, ConfigError> {
    match src.get(
        &args.force_iptables_binary,
        "force-iptables-binary",
        &["FORCE_IPTABLES_BINARY"],
    ) {
        None => Ok(None),
        Some(i) => match i.value.as_str() {
            "" => Ok(None),
            "legacy" => Ok(Some(ForcedBinary::Legacy)),
            "nft" => Ok(Some(ForcedBinary::Nft)),
            _ => Err(err(&i, "legacy or nft")),
        },
    }
}

/// `$ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR`: an IPv4 loopback range, 127.0.0.1/32 by default.
fn loopback_cidr_v4(src: &Sources) -> Result<Cidr, ConfigError> {
    let Some(input) = src.env(env::OUTBOUND_IPV4_LOOPBACK_CIDR) else {
        return Ok(Cidr {
            addr: IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1)),
            prefix: 32,
        });
    };
    match parse_cidr(input.value.trim()) {
        Some(c) if c.addr.is_loopback() && c.is_v4() && c.prefix >= 8 => Ok(c),
        _ => Err(err(
            &input,
            "an IPv4 loopback CIDR with a mask of /8 to /32",
        )),
    }
}

/// `$ISTIO_OUTBOUND_OWNER_GROUPS` (none for '*' or empty) and `..._EXCLUDE`.
fn owner_groups(src: &Sources) -> Result<(Option<Vec<String>>, Vec<String>), ConfigError> {
    let include = match src.env(env::OUTBOUND_OWNER_GROUPS) {
        None => None,
        Some(i) if i.value.trim() == "*" || i.value.trim().is_empty() => None,
        Some(i) => Some(parse_groups(&i)?),
    };
    let exclude = match src.env(env::OUTBOUND_OWNER_GROUPS_EXCLUDE) {
        None => Vec::new(),
        Some(i) => parse_groups(&i)?,
    };
    Ok((include, exclude))
}

/// The network namespace to enter, if named.
fn network_namespace(src: &Sources, args: &Args) -> Option<String> {
    src.get(
        &args.network_namespace,
        "network-namespace",
        &["NETWORK_NAMESPACE"],
    )
    .map(|i| i.value)
    .filter(|s| !s.is_empty())
}

impl Config {
    /// Builds the configuration from flags and env vars (looked up through `lookup`, so tests never
    /// touch the process environment). `user_uid` resolves `$ENVOY_USER` to a uid. Values are
    /// checked one after another, and the first bad one is the one reported.
    pub fn from_args(
        args: &Args,
        lookup: &dyn Fn(&str) -> Option<String>,
        user_uid: &dyn Fn(&str) -> Option<u32>,
    ) -> Result<Config, ConfigError> {
        let src = Sources { lookup };
        let proxy_port = src.port(&args.envoy_port, "envoy-port", &[], 15001)?;
        let inbound_capture_port = src.port(
            &args.inbound_capture_port,
            "inbound-capture-port",
            &["INBOUND_CAPTURE_PORT"],
            15006,
        )?;
        let inbound_tunnel_port = src.port(
            &args.inbound_tunnel_port,
            "inbound-tunnel-port",
            &["INBOUND_TUNNEL_PORT"],
            15008,
        )?;
        let (proxy_uids, proxy_gids) = proxy_owners(&src, args, user_uid)?;
        let mode = interception_mode(&src, args)?;
        let inbound = inbound_ports(&src, args)?;
        let (outbound, outbound_exclude_cidrs) = outbound_cidrs(&src, args)?;
        let outbound_ports = src.ports(
            &args.outbound_ports,
            "istio-outbound-ports",
            "ISTIO_OUTBOUND_PORTS",
        )?;
        let outbound_exclude_ports = src.ports(
            &args.local_outbound_ports_exclude,
            "istio-local-outbound-ports-exclude",
            "ISTIO_LOCAL_OUTBOUND_PORTS_EXCLUDE",
        )?;
        let exclude_interfaces = src.interfaces(
            &args.exclude_interfaces,
            "istio-exclude-interfaces",
            "ISTIO_EXCLUDE_INTERFACES",
        )?;
        let kube_virt_interfaces = src.interfaces(
            &args.kube_virt_interfaces,
            "kube-virt-interfaces",
            "KUBE_VIRT_INTERFACES",
        )?;
        let (tproxy_mark, tproxy_route_table) = tproxy_routing(&src, args)?;
        let (probe_port, probe_timeout) = validation_probe(&src, args)?;
        let force_binary = forced_binary(&src, args)?;
        let loopback_cidr_v4 = loopback_cidr_v4(&src)?;
        let (owner_groups_include, owner_groups_exclude) = owner_groups(&src)?;
        let network_namespace = network_namespace(&src, args);

        Ok(Config {
            proxy_port,
            inbound_capture_port,
            inbound_tunnel_port,
            proxy_uids,
            proxy_gids,
            mode,
            inbound,
            exclude_interfaces,
            outbound,
            outbound_exclude_cidrs,
            outbound_ports,
            outbound_exclude_ports,
            kube_virt_interfaces,
            tproxy_mark,
            tproxy_route_table,
            dry_run: src.flag(&args.dry_run, "dry-run", &["DRY_RUN"])?,
            probe_port,
            probe_timeout,
            skip_rule_apply: src.flag(
                &args.skip_rule_apply,
                "skip-rule-apply",
                &["SKIP_RULE_APPLY"],
            )?,
            run_validation: src.flag(
                &args.run_validation,
                "run-validation",
                &["RUN_VALIDATION"],
            )?,
            redirect_dns: src.flag(
                &args.redirect_dns,
                "redirect-dns",
                &["ISTIO_META_DNS_CAPTURE", "REDIRECT_DNS"],
            )?,
            capture_all_dns: src.flag(
                &args.capture_all_dns,
                "capture-all-dns",
                &["CAPTURE_ALL_DNS"],
            )?,
            drop_invalid: src.flag(
                &args.drop_invalid,
                "drop-invalid",
                &["INVALID_DROP", "DROP_INVALID"],
            )?,
            dual_stack: src.flag(
                &args.dual_stack,
                "dual-stack",
                &["ISTIO_DUAL_STACK", "DUAL_STACK"],
            )?,
            network_namespace,
            reconcile: src.flag(&args.reconcile, "reconcile", &["RECONCILE"])?,
            cleanup_only: src.flag(&args.cleanup_only, "cleanup-only", &["CLEANUP_ONLY"])?,
            force_apply: src.flag(&args.force_apply, "force-apply", &["FORCE_APPLY"])?,
            force_binary,
            native_nftables: src.flag(
                &args.native_nftables,
                "native-nftables",
                &["NATIVE_NFTABLES"],
            )?,
            loopback_cidr_v4,
            owner_groups_include,
            owner_groups_exclude,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn parse(argv: &[&str], env: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let mut full = vec!["istio-iptables"];
        full.extend_from_slice(argv);
        let args = Args::try_parse_from(full).expect("argv parses");
        let env: HashMap<String, String> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_args(&args, &|k| env.get(k).cloned(), &|_| None)
    }

    #[test]
    fn injector_args_parse() {
        let mut argv = crate::INJECTOR_ARGS.to_vec();
        argv.push("--log_output_level=default:info");
        let c = parse(&argv, &[]).unwrap();
        assert_eq!(c.proxy_port, 15001);
        assert_eq!(c.proxy_uids, vec![1337]);
        assert_eq!(c.proxy_gids, vec![1337]);
        assert_eq!(c.outbound, OutboundCidrs::All);
        assert_eq!(
            c.inbound,
            InboundPorts::All {
                exclude: vec![15090.into(), 15021.into(), 15020.into()]
            }
        );
        assert!(c.outbound_exclude_cidrs.is_empty());
    }

    #[test]
    fn cli_beats_env_beats_default() {
        let c = parse(&["-z", "16000"], &[("INBOUND_CAPTURE_PORT", "17000")]).unwrap();
        assert_eq!(c.inbound_capture_port, 16000);
        let c = parse(&[], &[("INBOUND_CAPTURE_PORT", "17000")]).unwrap();
        assert_eq!(c.inbound_capture_port, 17000);
        let c = parse(&[], &[]).unwrap();
        assert_eq!(c.inbound_capture_port, 15006);
        // envoy-port has no env binding in Istio.
        let c = parse(&[], &[("ENVOY_PORT", "1")]).unwrap();
        assert_eq!(c.proxy_port, 15001);
        let c = parse(&[], &[("ISTIO_META_DNS_CAPTURE", "true")]).unwrap();
        assert!(c.redirect_dns);
    }

    #[test]
    fn bad_values_name_the_input() {
        for bad in ["0", "65536", "-1", "80a", "015001", ""] {
            let e = parse(&["-d", &format!("15020,{bad}x")], &[]).unwrap_err();
            assert_eq!(e.input, "--istio-local-exclude-ports", "{bad}");
        }
        for bad in ["0", "65536", "80a", "015001"] {
            let e = parse(&["-p", bad], &[]).unwrap_err();
            assert_eq!(e.input, "--envoy-port");
        }
        let e = parse(&[], &[("ISTIO_SERVICE_CIDR", "10.0.0.0/33")]).unwrap_err();
        assert_eq!(e.input, "env ISTIO_SERVICE_CIDR");
        let e = parse(&["-m", "tproxy"], &[]).unwrap_err();
        assert!(e.to_string().contains("REDIRECT or TPROXY"));
        let e = parse(&["-c=-j ACCEPT"], &[]).unwrap_err();
        assert_eq!(e.input, "--istio-exclude-interfaces");
        let e = parse(&["-x", "*"], &[]).unwrap_err();
        assert_eq!(e.input, "--istio-service-exclude-cidr");
        let e = parse(&["--force-iptables-binary", "both"], &[]).unwrap_err();
        assert!(e.to_string().contains("legacy or nft"));
        let e = parse(&["-u", "13a7"], &[]).unwrap_err();
        assert_eq!(e.input, "--proxy-uid");
        let e = parse(&[], &[(env::OUTBOUND_IPV4_LOOPBACK_CIDR, "10.0.0.1/32")]).unwrap_err();
        assert!(e.to_string().contains("loopback"));
        let many: Vec<String> = (0..65).map(|i| format!("g{i}")).collect();
        let e = parse(&[], &[(env::OUTBOUND_OWNER_GROUPS, &many.join(","))]).unwrap_err();
        assert!(e.to_string().contains("at most 64"));
    }

    #[test]
    fn port_lists_take_ranges() {
        let c = parse(
            &[
                "-o",
                "3000:3010, 22",
                "-q",
                "80:80",
                "-b",
                "*",
                "-d",
                "1:1024",
            ],
            &[],
        )
        .unwrap();
        let range = |first, last| PortRange {
            first,
            last: Some(last),
        };
        assert_eq!(c.outbound_exclude_ports, vec![range(3000, 3010), 22.into()]);
        assert_eq!(c.outbound_ports, vec![range(80, 80)]);
        assert_eq!(
            c.inbound,
            InboundPorts::All {
                exclude: vec![range(1, 1024)]
            }
        );
        assert_eq!(range(3000, 3010).to_string(), "3000:3010");
        for bad in [
            "3010:3000",
            "0:10",
            "3000:",
            ":3010",
            "1:2:3",
            "1:65536",
            "01:2",
            "1-2",
        ] {
            let e = parse(&["-o", bad], &[]).unwrap_err();
            assert_eq!(e.input, "--istio-local-outbound-ports-exclude", "{bad}");
        }
        // The single ports stay single ports.
        assert!(parse(&["-p", "15001:15002"], &[]).is_err());
    }

    #[test]
    fn istio_aliases_win_over_the_primary_env_var() {
        let c = parse(
            &[],
            &[
                ("REDIRECT_DNS", "false"),
                ("ISTIO_META_DNS_CAPTURE", "true"),
                ("DROP_INVALID", "true"),
                ("INVALID_DROP", "false"),
            ],
        )
        .unwrap();
        assert!(c.redirect_dns);
        assert!(!c.drop_invalid);
        let c = parse(
            &["--redirect-dns=false"],
            &[("ISTIO_META_DNS_CAPTURE", "true")],
        )
        .unwrap();
        assert!(!c.redirect_dns);
    }

    #[test]
    fn repeated_flags_take_the_last_value_and_log_flags_are_accepted() {
        let c = parse(
            &[
                "-p",
                "1",
                "-p",
                "2",
                "--log_as_json",
                "--log_target",
                "stdout",
                "--log_target=/dev/null",
                "--log_caller=default",
                "--log_stacktrace_level=default:none",
                "--vklog=3",
            ],
            &[],
        )
        .unwrap();
        assert_eq!(c.proxy_port, 2);
    }

    #[test]
    fn proxy_uid_defaults_to_envoy_user() {
        let args = Args::try_parse_from(["istio-iptables"]).unwrap();
        let c =
            Config::from_args(&args, &|_| None, &|u| (u == "istio-proxy").then_some(4242)).unwrap();
        assert_eq!(c.proxy_uids, vec![4242]);
        assert_eq!(c.proxy_gids, vec![4242]);
    }
}
