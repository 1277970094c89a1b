//! The capture plan: a typed list of rules per IP family, built from a validated `Config`.
//!
//! Mirrors the rule order of Istio's `tools/istio-iptables/pkg/capture/run.go` (`Run()`), so the
//! rendered payload for the injector's default args matches Istio's rule set line for line.

use crate::config::{Cidr, Config, InboundPorts, InterceptionMode, OutboundCidrs, PortRange};

pub const ISTIO_INBOUND: &str = "ISTIO_INBOUND";
pub const ISTIO_REDIRECT: &str = "ISTIO_REDIRECT";
pub const ISTIO_IN_REDIRECT: &str = "ISTIO_IN_REDIRECT";
pub const ISTIO_OUTPUT: &str = "ISTIO_OUTPUT";
pub const ISTIO_OUTPUT_DNS: &str = "ISTIO_OUTPUT_DNS";
pub const ISTIO_DIVERT: &str = "ISTIO_DIVERT";
pub const ISTIO_TPROXY: &str = "ISTIO_TPROXY";
pub const ISTIO_DROP: &str = "ISTIO_DROP";

/// Every chain this tool may own; cleanup removes exactly these.
pub const OUR_CHAINS: [&str; 8] = [
    ISTIO_INBOUND,
    ISTIO_REDIRECT,
    ISTIO_IN_REDIRECT,
    ISTIO_OUTPUT,
    ISTIO_OUTPUT_DNS,
    ISTIO_DIVERT,
    ISTIO_TPROXY,
    ISTIO_DROP,
];

/// The source address Envoy uses for inbound traffic to the app (never captured).
const INBOUND_PASSTHROUGH_V4: &str = "127.0.0.6/32";
const INBOUND_PASSTHROUGH_V6: &str = "::6/128";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    V4,
    V6,
}

/// Tables in the order iptables-restore payloads list them (sorted by name, as Istio does).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Table {
    Filter,
    Mangle,
    Nat,
    Raw,
}

impl Table {
    pub fn name(self) -> &'static str {
        match self {
            Table::Filter => "filter",
            Table::Mangle => "mangle",
            Table::Nat => "nat",
            Table::Raw => "raw",
        }
    }

    pub fn from_name(name: &str) -> Option<Table> {
        [Table::Filter, Table::Mangle, Table::Nat, Table::Raw]
            .into_iter()
            .find(|t| t.name() == name)
    }
}

/// Where a rule goes in its chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Position {
    Append,
    /// `-I CHAIN n` (1-based).
    Insert(u32),
}

/// One iptables rule: its table, chain, position and match/target arguments as separate tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub table: Table,
    pub chain: &'static str,
    pub position: Position,
    pub args: Vec<String>,
    /// The step of Istio's `Run()` the rule belongs to, numbered alike in every family: a rule
    /// alone, or a loop over one family's addresses (CIDRs, DNS servers). The nftables renderer
    /// writes both families into one `inet` table step by step, IPv4's rules before IPv6's, as
    /// Istio's nftables mode does.
    pub section: u32,
}

impl Rule {
    /// The chain this rule jumps to, if any.
    pub fn jump_target(&self) -> Option<&str> {
        self.args
            .iter()
            .position(|a| a == "-j")
            .and_then(|i| self.args.get(i + 1))
            .map(String::as_str)
    }
}

/// The rules for one IP family, in the order they are applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub family: Family,
    pub rules: Vec<Rule>,
}

/// Facts about the pod the plan depends on, gathered before planning so `plan` stays pure.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodFacts {
    /// Nameservers from /etc/resolv.conf (used for DNS capture unless --capture-all-dns).
    pub dns_servers: Vec<std::net::IpAddr>,
}

/// The agent's DNS proxy port.
pub const DNS_PROXY_PORT: &str = "15053";
/// Mark for Envoy's own outbound packets to the local workload in TPROXY mode (Istio's OutboundMark).
pub const OUTBOUND_MARK: &str = "1338";

/// The rules of one family, in the order they are built.
#[derive(Default)]
struct Builder {
    rules: Vec<Rule>,
    section: u32,
    in_list: bool,
}

impl Builder {
    fn push(&mut self, table: Table, chain: &'static str, position: Position, args: &[&str]) {
        if !self.in_list {
            self.section += 1;
        }
        self.rules.push(Rule {
            table,
            chain,
            position,
            args: args.iter().map(|s| s.to_string()).collect(),
            section: self.section,
        });
    }
    /// Rules whose number depends on the family (a loop over its addresses, or a rule only
    /// when it has some): one section, so the sections after it number alike in every family.
    fn list(&mut self, f: impl FnOnce(&mut Builder)) {
        self.section += 1;
        self.in_list = true;
        f(self);
        self.in_list = false;
    }
    fn append(&mut self, table: Table, chain: &'static str, args: &[&str]) {
        self.push(table, chain, Position::Append, args);
    }
    fn nat(&mut self, chain: &'static str, args: &[&str]) {
        self.append(Table::Nat, chain, args);
    }
    fn mangle(&mut self, chain: &'static str, args: &[&str]) {
        self.append(Table::Mangle, chain, args);
    }
    fn raw(&mut self, chain: &'static str, args: &[&str]) {
        self.append(Table::Raw, chain, args);
    }
}

/// One family's view of the config: the values the sections share, worked out once.
struct Ctx<'a> {
    cfg: &'a Config,
    v4: bool,
    tproxy: bool,
    loopback: String,
    /// Envoy's inbound passthrough source address of this family.
    passthrough: &'static str,
    tunnel: String,
    capture_port: String,
    mark: String,
    /// `--uid-owner` with each proxy uid, then `--gid-owner` with each proxy gid.
    owners: Vec<(&'static str, String)>,
    /// This family's DNS servers, as host routes.
    dns_servers: Vec<String>,
    /// DNS capture is on: requested, and there is something to capture anywhere (as in Istio).
    redirect_dns: bool,
}

impl<'a> Ctx<'a> {
    fn new(cfg: &'a Config, family: Family, facts: &PodFacts) -> Ctx<'a> {
        let v4 = family == Family::V4;
        let (loopback, passthrough, host_bits) = if v4 {
            (
                cfg.loopback_cidr_v4.to_string(),
                INBOUND_PASSTHROUGH_V4,
                "/32",
            )
        } else {
            ("::1/128".to_string(), INBOUND_PASSTHROUGH_V6, "/128")
        };
        let uids = cfg.proxy_uids.iter().map(|id| ("--uid-owner", id));
        let gids = cfg.proxy_gids.iter().map(|id| ("--gid-owner", id));
        Ctx {
            cfg,
            v4,
            tproxy: cfg.mode == InterceptionMode::Tproxy,
            loopback,
            passthrough,
            tunnel: cfg.inbound_tunnel_port.to_string(),
            capture_port: cfg.inbound_capture_port.to_string(),
            mark: cfg.tproxy_mark.to_string(),
            owners: uids
                .chain(gids)
                .map(|(kind, id)| (kind, id.to_string()))
                .collect(),
            dns_servers: facts
                .dns_servers
                .iter()
                .filter(|s| s.is_ipv4() == v4)
                .map(|s| format!("{s}{host_bits}"))
                .collect(),
            redirect_dns: cfg.redirect_dns
                && (cfg.capture_all_dns || !facts.dns_servers.is_empty()),
        }
    }

    /// The CIDRs of this family, rendered.
    fn of_family(&self, cidrs: &[Cidr]) -> Vec<String> {
        cidrs
            .iter()
            .filter(|c| c.is_v4() == self.v4)
            .map(ToString::to_string)
            .collect()
    }
}

/// Builds the plan for one family, in the order of Istio's `capture/run.go`: one section function
/// per block of `Run()`, called in its order. Pure: reads nothing but its arguments.
pub fn plan(cfg: &Config, family: Family, facts: &PodFacts) -> Plan {
    let c = Ctx::new(cfg, family, facts);
    let mut b = Builder::default();
    excluded_interfaces(&c, &mut b);
    drop_invalid(&c, &mut b);
    redirect_chains(&c, &mut b);
    inbound_capture(&c, &mut b);
    outbound_exclusions(&c, &mut b);
    proxy_owner_rules(&c, &mut b);
    owner_groups(&c, &mut b);
    if c.redirect_dns {
        dns_redirect(&c, &mut b);
        dns_conntrack_zones(&c, &mut b);
    }
    outbound_capture(&c, &mut b);
    if c.tproxy {
        tproxy_marks(&c, &mut b);
    }
    Plan {
        family,
        rules: b.rules,
    }
}

/// Excluded interfaces are never captured; KubeVirt interfaces skip the rest of PREROUTING
/// (Istio's `shortCircuitKubeInternalInterface`).
fn excluded_interfaces(c: &Ctx, b: &mut Builder) {
    for iface in &c.cfg.exclude_interfaces {
        b.nat("PREROUTING", &["-i", iface, "-j", "RETURN"]);
        b.nat("OUTPUT", &["-o", iface, "-j", "RETURN"]);
    }
    if c.tproxy {
        for iface in &c.cfg.exclude_interfaces {
            b.mangle("PREROUTING", &["-i", iface, "-j", "RETURN"]);
            b.mangle("OUTPUT", &["-o", iface, "-j", "RETURN"]);
        }
    }
    for iface in &c.cfg.kube_virt_interfaces {
        b.push(
            Table::Nat,
            "PREROUTING",
            Position::Insert(1),
            &["-i", iface, "-j", "RETURN"],
        );
    }
}

/// `--drop-invalid`: out-of-window packets are dropped rather than answered with a reset.
fn drop_invalid(c: &Ctx, b: &mut Builder) {
    if c.cfg.drop_invalid {
        b.mangle(
            "PREROUTING",
            &["-m", "conntrack", "--ctstate", "INVALID", "-j", ISTIO_DROP],
        );
        b.mangle(ISTIO_DROP, &["-j", "DROP"]);
    }
}

/// The tunnel port bypass and the two redirect chains (to Envoy's outbound and inbound ports).
fn redirect_chains(c: &Ctx, b: &mut Builder) {
    let proxy_port = c.cfg.proxy_port.to_string();
    b.nat(
        ISTIO_INBOUND,
        &["-p", "tcp", "--dport", &c.tunnel, "-j", "RETURN"],
    );
    b.nat(
        ISTIO_REDIRECT,
        &["-p", "tcp", "-j", "REDIRECT", "--to-ports", &proxy_port],
    );
    b.nat(
        ISTIO_IN_REDIRECT,
        &["-p", "tcp", "-j", "REDIRECT", "--to-ports", &c.capture_port],
    );
}

/// Inbound capture, REDIRECT (nat) or TPROXY (mangle) (Istio's `handleInboundPortsInclude`).
fn inbound_capture(c: &Ctx, b: &mut Builder) {
    let table = match &c.cfg.inbound {
        InboundPorts::None => return,
        _ if c.tproxy => {
            tproxy_divert_chains(c, b);
            Table::Mangle
        }
        _ => Table::Nat,
    };
    b.append(table, "PREROUTING", &["-p", "tcp", "-j", ISTIO_INBOUND]);
    match &c.cfg.inbound {
        InboundPorts::All { exclude } => inbound_all_ports(c, b, table, exclude),
        InboundPorts::Only(ports) => inbound_listed_ports(c, b, ports),
        InboundPorts::None => {}
    }
}

/// ISTIO_DIVERT marks and accepts packets of established inbound connections; ISTIO_TPROXY
/// hands new ones to Envoy's inbound port.
fn tproxy_divert_chains(c: &Ctx, b: &mut Builder) {
    let tproxy_mark = format!("{}/0xffffffff", c.mark);
    b.mangle(ISTIO_DIVERT, &["-j", "MARK", "--set-mark", &c.mark]);
    b.mangle(ISTIO_DIVERT, &["-j", "ACCEPT"]);
    b.mangle(
        ISTIO_TPROXY,
        &[
            "!",
            "-d",
            &c.loopback,
            "-p",
            "tcp",
            "-j",
            "TPROXY",
            "--tproxy-mark",
            &tproxy_mark,
            "--on-port",
            &c.capture_port,
        ],
    );
}

/// `-b '*'`: every inbound port but the excluded ones.
fn inbound_all_ports(c: &Ctx, b: &mut Builder, table: Table, exclude: &[PortRange]) {
    for port in exclude {
        let port = port.to_string();
        b.append(
            table,
            ISTIO_INBOUND,
            &["-p", "tcp", "--dport", &port, "-j", "RETURN"],
        );
    }
    if c.tproxy {
        b.mangle(
            ISTIO_INBOUND,
            &[
                "-p",
                "tcp",
                "-m",
                "conntrack",
                "--ctstate",
                "RELATED,ESTABLISHED",
                "-j",
                ISTIO_DIVERT,
            ],
        );
        b.mangle(ISTIO_INBOUND, &["-p", "tcp", "-j", ISTIO_TPROXY]);
    } else {
        b.nat(ISTIO_INBOUND, &["-p", "tcp", "-j", ISTIO_IN_REDIRECT]);
    }
}

/// `-b p1,p2`: only the listed inbound ports.
fn inbound_listed_ports(c: &Ctx, b: &mut Builder, ports: &[PortRange]) {
    for port in ports {
        let port = port.to_string();
        if c.tproxy {
            b.mangle(
                ISTIO_INBOUND,
                &[
                    "-p",
                    "tcp",
                    "--dport",
                    &port,
                    "-m",
                    "conntrack",
                    "--ctstate",
                    "RELATED,ESTABLISHED",
                    "-j",
                    ISTIO_DIVERT,
                ],
            );
            b.mangle(
                ISTIO_INBOUND,
                &["-p", "tcp", "--dport", &port, "-j", ISTIO_TPROXY],
            );
        } else {
            b.nat(
                ISTIO_INBOUND,
                &["-p", "tcp", "--dport", &port, "-j", ISTIO_IN_REDIRECT],
            );
        }
    }
}

/// The jump into ISTIO_OUTPUT, excluded outbound ports, and Envoy's inbound passthrough source.
fn outbound_exclusions(c: &Ctx, b: &mut Builder) {
    b.nat("OUTPUT", &["-j", ISTIO_OUTPUT]);
    for port in &c.cfg.outbound_exclude_ports {
        let port = port.to_string();
        b.nat(
            ISTIO_OUTPUT,
            &["-p", "tcp", "--dport", &port, "-j", "RETURN"],
        );
        b.nat(
            ISTIO_OUTPUT,
            &["-p", "udp", "--dport", &port, "-j", "RETURN"],
        );
    }
    b.nat(
        ISTIO_OUTPUT,
        &["-o", "lo", "-s", c.passthrough, "-j", "RETURN"],
    );
}

fn is_loopback(addr: std::net::IpAddr) -> bool {
    match addr {
        std::net::IpAddr::V6(v6) => v6
            .to_ipv4_mapped()
            .map_or(v6.is_loopback(), |v4| v4.is_loopback()),
        v4 => v4.is_loopback(),
    }
}

/// Per proxy uid, then per gid: the app calling itself through Envoy is redirected inbound, the
/// app calling itself directly is not captured, and Envoy's own traffic is never captured.
fn proxy_owner_rules(c: &Ctx, b: &mut Builder) {
    // If the include list names a loopback range (in either family, an IPv4-mapped one too, as
    // Istio's Go `IsLoopback` reads it), traffic to lo is captured rather than returned.
    let include_has_loopback = match &c.cfg.outbound {
        OutboundCidrs::Only(cidrs) => cidrs.iter().any(|cidr| is_loopback(cidr.addr)),
        _ => false,
    };
    let dns_tunnel_ports = format!("53,{}", c.tunnel);
    for (kind, id) in &c.owners {
        // The app calling itself through a service VIP: Envoy's outbound connection to the
        // pod's own address goes over lo and must be treated as inbound.
        let mut args = vec!["-o", "lo", "!", "-d", &c.loopback, "-p", "tcp"];
        if c.redirect_dns && *kind == "--uid-owner" {
            args.extend(["-m", "multiport", "!", "--dports", &dns_tunnel_ports]);
        } else {
            args.extend(["!", "--dport", &c.tunnel]);
        }
        args.extend(["-m", "owner", kind, id, "-j", ISTIO_IN_REDIRECT]);
        b.nat(ISTIO_OUTPUT, &args);
        // The app calling itself directly over lo is not captured (its DNS still is, when DNS
        // is redirected).
        if !include_has_loopback {
            let mut args = vec!["-o", "lo"];
            if c.redirect_dns {
                args.extend(["-p", "tcp", "!", "--dport", "53"]);
            }
            args.extend(["-m", "owner", "!", kind, id, "-j", "RETURN"]);
            b.nat(ISTIO_OUTPUT, &args);
        }
        b.nat(ISTIO_OUTPUT, &["-m", "owner", kind, id, "-j", "RETURN"]);
    }
}

/// ISTIO_OUTBOUND_OWNER_GROUPS(_EXCLUDE) (Istio's `handleCaptureByOwnerGroup`).
fn owner_groups(c: &Ctx, b: &mut Builder) {
    match &c.cfg.owner_groups_include {
        None => {
            for group in &c.cfg.owner_groups_exclude {
                b.nat(
                    ISTIO_OUTPUT,
                    &["-m", "owner", "--gid-owner", group, "-j", "RETURN"],
                );
            }
        }
        Some(groups) => {
            let mut args: Vec<&str> = Vec::new();
            for group in groups {
                args.extend(["-m", "owner", "!", "--gid-owner", group]);
            }
            args.extend(["-j", "RETURN"]);
            b.nat(ISTIO_OUTPUT, &args);
        }
    }
}

/// DNS to the resolv.conf servers (or all DNS) goes to the agent's DNS proxy (Istio's
/// `SetupDNSRedir`).
fn dns_redirect(c: &Ctx, b: &mut Builder) {
    let all = c.cfg.capture_all_dns;
    b.raw("OUTPUT", &["-j", ISTIO_OUTPUT_DNS]);
    b.list(|b| {
        if all || !c.dns_servers.is_empty() {
            b.nat(ISTIO_OUTPUT, &["-j", ISTIO_OUTPUT_DNS]);
        }
    });
    if all {
        b.nat(
            ISTIO_OUTPUT_DNS,
            &[
                "-p",
                "tcp",
                "--dport",
                "53",
                "-j",
                "REDIRECT",
                "--to-ports",
                DNS_PROXY_PORT,
            ],
        );
        b.nat(
            ISTIO_OUTPUT_DNS,
            &[
                "-p",
                "udp",
                "--dport",
                "53",
                "-j",
                "REDIRECT",
                "--to-port",
                DNS_PROXY_PORT,
            ],
        );
        return;
    }
    for proto in ["tcp", "udp"] {
        // iptables' REDIRECT takes both spellings; Istio writes these two.
        let to = if proto == "tcp" {
            "--to-ports"
        } else {
            "--to-port"
        };
        b.list(|b| {
            for s in &c.dns_servers {
                b.nat(
                    ISTIO_OUTPUT_DNS,
                    &[
                        "-p",
                        proto,
                        "--dport",
                        "53",
                        "-d",
                        s,
                        "-j",
                        "REDIRECT",
                        to,
                        DNS_PROXY_PORT,
                    ],
                );
            }
        });
    }
}

/// Splits DNS into two conntrack zones: agent ↔ upstream (1) and app ↔ agent (2).
fn dns_conntrack_zones(c: &Ctx, b: &mut Builder) {
    for (kind, id) in &c.owners {
        b.raw(
            ISTIO_OUTPUT_DNS,
            &[
                "-p", "udp", "--dport", "53", "-m", "owner", kind, id, "-j", "CT", "--zone", "1",
            ],
        );
        b.raw(
            ISTIO_OUTPUT_DNS,
            &[
                "-p",
                "udp",
                "--sport",
                DNS_PROXY_PORT,
                "-m",
                "owner",
                kind,
                id,
                "-j",
                "CT",
                "--zone",
                "2",
            ],
        );
    }
    if c.cfg.capture_all_dns {
        b.raw("PREROUTING", &["-j", ISTIO_INBOUND]);
        b.raw(
            ISTIO_OUTPUT_DNS,
            &["-p", "udp", "--dport", "53", "-j", "CT", "--zone", "2"],
        );
        b.raw(
            ISTIO_INBOUND,
            &["-p", "udp", "--sport", "53", "-j", "CT", "--zone", "1"],
        );
        return;
    }
    b.list(|b| {
        if !c.dns_servers.is_empty() {
            b.raw("PREROUTING", &["-j", ISTIO_INBOUND]);
        }
    });
    b.list(|b| {
        for s in &c.dns_servers {
            b.raw(
                ISTIO_OUTPUT_DNS,
                &[
                    "-p", "udp", "--dport", "53", "-d", s, "-j", "CT", "--zone", "2",
                ],
            );
            b.raw(
                ISTIO_INBOUND,
                &[
                    "-p", "udp", "--sport", "53", "-s", s, "-j", "CT", "--zone", "1",
                ],
            );
        }
    });
}

/// Loopback and excluded CIDRs return; outbound ports and included CIDRs go to Envoy, also from
/// KubeVirt interfaces (Istio's `handleOutboundPortsInclude` and `handleOutboundIncludeRules`).
fn outbound_capture(c: &Ctx, b: &mut Builder) {
    b.nat(ISTIO_OUTPUT, &["-d", &c.loopback, "-j", "RETURN"]);
    b.list(|b| {
        for cidr in c.of_family(&c.cfg.outbound_exclude_cidrs) {
            b.nat(ISTIO_OUTPUT, &["-d", &cidr, "-j", "RETURN"]);
        }
    });
    for port in &c.cfg.outbound_ports {
        let port = port.to_string();
        b.nat(
            ISTIO_OUTPUT,
            &["-p", "tcp", "--dport", &port, "-j", ISTIO_REDIRECT],
        );
    }
    match &c.cfg.outbound {
        OutboundCidrs::None => {}
        OutboundCidrs::All => {
            b.nat(ISTIO_OUTPUT, &["-j", ISTIO_REDIRECT]);
            for iface in &c.cfg.kube_virt_interfaces {
                b.push(
                    Table::Nat,
                    "PREROUTING",
                    Position::Insert(1),
                    &["-i", iface, "-j", ISTIO_REDIRECT],
                );
            }
        }
        OutboundCidrs::Only(cidrs) => b.list(|b| {
            for cidr in c.of_family(cidrs) {
                for iface in &c.cfg.kube_virt_interfaces {
                    b.push(
                        Table::Nat,
                        "PREROUTING",
                        Position::Insert(1),
                        &["-i", iface, "-d", &cidr, "-j", ISTIO_REDIRECT],
                    );
                }
                b.nat(ISTIO_OUTPUT, &["-d", &cidr, "-j", ISTIO_REDIRECT]);
            }
        }),
    }
}

/// TPROXY mode's marks: the connection keeps Envoy's original-source mark, Envoy's packets to the
/// local workload are marked outbound, and marked or passthrough inbound packets skip capture.
fn tproxy_marks(c: &Ctx, b: &mut Builder) {
    let mark = c.mark.as_str();
    b.mangle(
        "PREROUTING",
        &[
            "-p",
            "tcp",
            "-m",
            "mark",
            "--mark",
            mark,
            "-j",
            "CONNMARK",
            "--save-mark",
        ],
    );
    b.mangle(
        "OUTPUT",
        &[
            "-p", "tcp", "-o", "lo", "-m", "mark", "--mark", mark, "-j", "RETURN",
        ],
    );
    for (kind, id) in &c.owners {
        b.mangle(
            "OUTPUT",
            &[
                "!",
                "-d",
                &c.loopback,
                "-p",
                "tcp",
                "-o",
                "lo",
                "-m",
                "owner",
                kind,
                id,
                "-j",
                "MARK",
                "--set-mark",
                OUTBOUND_MARK,
            ],
        );
    }
    b.mangle(
        "OUTPUT",
        &[
            "-p",
            "tcp",
            "-m",
            "connmark",
            "--mark",
            mark,
            "-j",
            "CONNMARK",
            "--restore-mark",
        ],
    );
    b.push(
        Table::Mangle,
        ISTIO_INBOUND,
        Position::Insert(1),
        &["-p", "tcp", "-m", "mark", "--mark", mark, "-j", "RETURN"],
    );
    b.push(
        Table::Mangle,
        ISTIO_INBOUND,
        Position::Insert(2),
        &["-p", "tcp", "-s", c.passthrough, "-i", "lo", "-j", "RETURN"],
    );
    b.push(
        Table::Mangle,
        ISTIO_INBOUND,
        Position::Insert(3),
        &[
            "-p",
            "tcp",
            "-i",
            "lo",
            "-m",
            "mark",
            "!",
            "--mark",
            OUTBOUND_MARK,
            "-j",
            "RETURN",
        ],
    );
}
