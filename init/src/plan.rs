//! The capture plan: a typed list of rules per IP family, built from a validated `Config`.
//!
//! Mirrors the rule order of Istio's `tools/istio-iptables/pkg/capture/run.go` (`Run()`), so the
//! rendered payload for the injector's default args matches Istio's rule set line for line.

use crate::config::{Cidr, Config, InboundPorts, InterceptionMode, OutboundCidrs};

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

struct Builder {
    family: Family,
    rules: Vec<Rule>,
}

impl Builder {
    fn push(&mut self, table: Table, chain: &'static str, position: Position, args: &[&str]) {
        self.rules.push(Rule {
            table,
            chain,
            position,
            args: args.iter().map(|s| s.to_string()).collect(),
        });
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

/// Builds the plan for one family, in the order of Istio's `capture/run.go`. Pure: reads nothing
/// but its arguments.
pub fn plan(cfg: &Config, family: Family, facts: &PodFacts) -> Plan {
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
    let of_family = |c: &&Cidr| c.is_v4() == v4;
    let tproxy = cfg.mode == InterceptionMode::Tproxy;
    let mut b = Builder {
        family,
        rules: Vec::new(),
    };
    let tunnel = cfg.inbound_tunnel_port.to_string();
    let proxy_port = cfg.proxy_port.to_string();
    let capture_port = cfg.inbound_capture_port.to_string();
    let mark = cfg.tproxy_mark.to_string();
    let uids: Vec<String> = cfg.proxy_uids.iter().map(ToString::to_string).collect();
    let gids: Vec<String> = cfg.proxy_gids.iter().map(ToString::to_string).collect();

    // DNS servers of this family; capture is off when there are none anywhere (as in Istio).
    let servers: Vec<String> = facts
        .dns_servers
        .iter()
        .filter(|s| s.is_ipv4() == v4)
        .map(|s| format!("{s}{host_bits}"))
        .collect();
    let redirect_dns = cfg.redirect_dns && (cfg.capture_all_dns || !facts.dns_servers.is_empty());

    for iface in &cfg.exclude_interfaces {
        b.nat("PREROUTING", &["-i", iface, "-j", "RETURN"]);
        b.nat("OUTPUT", &["-o", iface, "-j", "RETURN"]);
    }
    if tproxy {
        for iface in &cfg.exclude_interfaces {
            b.mangle("PREROUTING", &["-i", iface, "-j", "RETURN"]);
            b.mangle("OUTPUT", &["-o", iface, "-j", "RETURN"]);
        }
    }
    for iface in &cfg.kube_virt_interfaces {
        b.push(
            Table::Nat,
            "PREROUTING",
            Position::Insert(1),
            &["-i", iface, "-j", "RETURN"],
        );
    }
    if cfg.drop_invalid {
        b.mangle(
            "PREROUTING",
            &["-m", "conntrack", "--ctstate", "INVALID", "-j", ISTIO_DROP],
        );
        b.mangle(ISTIO_DROP, &["-j", "DROP"]);
    }

    b.nat(
        ISTIO_INBOUND,
        &["-p", "tcp", "--dport", &tunnel, "-j", "RETURN"],
    );
    b.nat(
        ISTIO_REDIRECT,
        &["-p", "tcp", "-j", "REDIRECT", "--to-ports", &proxy_port],
    );
    b.nat(
        ISTIO_IN_REDIRECT,
        &["-p", "tcp", "-j", "REDIRECT", "--to-ports", &capture_port],
    );

    if cfg.inbound != InboundPorts::None {
        let table = if tproxy {
            let tproxy_mark = format!("{mark}/0xffffffff");
            b.mangle(ISTIO_DIVERT, &["-j", "MARK", "--set-mark", &mark]);
            b.mangle(ISTIO_DIVERT, &["-j", "ACCEPT"]);
            b.mangle(
                ISTIO_TPROXY,
                &[
                    "!",
                    "-d",
                    &loopback,
                    "-p",
                    "tcp",
                    "-j",
                    "TPROXY",
                    "--tproxy-mark",
                    &tproxy_mark,
                    "--on-port",
                    &capture_port,
                ],
            );
            Table::Mangle
        } else {
            Table::Nat
        };
        b.append(table, "PREROUTING", &["-p", "tcp", "-j", ISTIO_INBOUND]);
        match &cfg.inbound {
            InboundPorts::All { exclude } => {
                for port in exclude {
                    let port = port.to_string();
                    b.append(
                        table,
                        ISTIO_INBOUND,
                        &["-p", "tcp", "--dport", &port, "-j", "RETURN"],
                    );
                }
                if tproxy {
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
            InboundPorts::Only(ports) => {
                for port in ports {
                    let port = port.to_string();
                    if tproxy {
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
            InboundPorts::None => {}
        }
    }

    b.nat("OUTPUT", &["-j", ISTIO_OUTPUT]);
    for port in &cfg.outbound_exclude_ports {
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
        &["-o", "lo", "-s", passthrough, "-j", "RETURN"],
    );

    // If the include list names a loopback range, traffic to lo is captured rather than returned.
    let include_has_loopback = match &cfg.outbound {
        OutboundCidrs::Only(cidrs) => cidrs.iter().any(|c| c.addr.is_loopback()),
        _ => false,
    };
    let dns_tunnel_ports = format!("53,{tunnel}");
    for (kind, ids) in [("--uid-owner", &uids), ("--gid-owner", &gids)] {
        for id in ids {
            // The app calling itself through a service VIP: Envoy's outbound connection to the
            // pod's own address goes over lo and must be treated as inbound.
            if redirect_dns && kind == "--uid-owner" {
                b.nat(
                    ISTIO_OUTPUT,
                    &[
                        "-o",
                        "lo",
                        "!",
                        "-d",
                        &loopback,
                        "-p",
                        "tcp",
                        "-m",
                        "multiport",
                        "!",
                        "--dports",
                        &dns_tunnel_ports,
                        "-m",
                        "owner",
                        kind,
                        id,
                        "-j",
                        ISTIO_IN_REDIRECT,
                    ],
                );
            } else {
                b.nat(
                    ISTIO_OUTPUT,
                    &[
                        "-o",
                        "lo",
                        "!",
                        "-d",
                        &loopback,
                        "-p",
                        "tcp",
                        "!",
                        "--dport",
                        &tunnel,
                        "-m",
                        "owner",
                        kind,
                        id,
                        "-j",
                        ISTIO_IN_REDIRECT,
                    ],
                );
            }
            if !include_has_loopback {
                if redirect_dns {
                    b.nat(
                        ISTIO_OUTPUT,
                        &[
                            "-o", "lo", "-p", "tcp", "!", "--dport", "53", "-m", "owner", "!",
                            kind, id, "-j", "RETURN",
                        ],
                    );
                } else {
                    b.nat(
                        ISTIO_OUTPUT,
                        &["-o", "lo", "-m", "owner", "!", kind, id, "-j", "RETURN"],
                    );
                }
            }
            b.nat(ISTIO_OUTPUT, &["-m", "owner", kind, id, "-j", "RETURN"]);
        }
    }

    match &cfg.owner_groups_include {
        None => {
            for group in &cfg.owner_groups_exclude {
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

    if redirect_dns {
        b.raw("OUTPUT", &["-j", ISTIO_OUTPUT_DNS]);
        if cfg.capture_all_dns || !servers.is_empty() {
            b.nat(ISTIO_OUTPUT, &["-j", ISTIO_OUTPUT_DNS]);
        }
        if cfg.capture_all_dns {
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
        } else {
            for s in &servers {
                b.nat(
                    ISTIO_OUTPUT_DNS,
                    &[
                        "-p",
                        "tcp",
                        "--dport",
                        "53",
                        "-d",
                        s,
                        "-j",
                        "REDIRECT",
                        "--to-ports",
                        DNS_PROXY_PORT,
                    ],
                );
            }
            for s in &servers {
                b.nat(
                    ISTIO_OUTPUT_DNS,
                    &[
                        "-p",
                        "udp",
                        "--dport",
                        "53",
                        "-d",
                        s,
                        "-j",
                        "REDIRECT",
                        "--to-port",
                        DNS_PROXY_PORT,
                    ],
                );
            }
        }
        // Split DNS into two conntrack zones: agent ↔ upstream (1) and app ↔ agent (2).
        for (kind, ids) in [("--uid-owner", &uids), ("--gid-owner", &gids)] {
            for id in ids {
                b.raw(
                    ISTIO_OUTPUT_DNS,
                    &[
                        "-p", "udp", "--dport", "53", "-m", "owner", kind, id, "-j", "CT",
                        "--zone", "1",
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
        }
        if cfg.capture_all_dns {
            b.raw("PREROUTING", &["-j", ISTIO_INBOUND]);
            b.raw(
                ISTIO_OUTPUT_DNS,
                &["-p", "udp", "--dport", "53", "-j", "CT", "--zone", "2"],
            );
            b.raw(
                ISTIO_INBOUND,
                &["-p", "udp", "--sport", "53", "-j", "CT", "--zone", "1"],
            );
        } else {
            if !servers.is_empty() {
                b.raw("PREROUTING", &["-j", ISTIO_INBOUND]);
            }
            for s in &servers {
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
        }
    }

    b.nat(ISTIO_OUTPUT, &["-d", &loopback, "-j", "RETURN"]);
    for cidr in cfg.outbound_exclude_cidrs.iter().filter(of_family) {
        let cidr = cidr.to_string();
        b.nat(ISTIO_OUTPUT, &["-d", &cidr, "-j", "RETURN"]);
    }
    for port in &cfg.outbound_ports {
        let port = port.to_string();
        b.nat(
            ISTIO_OUTPUT,
            &["-p", "tcp", "--dport", &port, "-j", ISTIO_REDIRECT],
        );
    }
    match &cfg.outbound {
        OutboundCidrs::None => {}
        OutboundCidrs::All => {
            b.nat(ISTIO_OUTPUT, &["-j", ISTIO_REDIRECT]);
            for iface in &cfg.kube_virt_interfaces {
                b.push(
                    Table::Nat,
                    "PREROUTING",
                    Position::Insert(1),
                    &["-i", iface, "-j", ISTIO_REDIRECT],
                );
            }
        }
        OutboundCidrs::Only(cidrs) => {
            for cidr in cidrs.iter().filter(of_family) {
                let cidr = cidr.to_string();
                for iface in &cfg.kube_virt_interfaces {
                    b.push(
                        Table::Nat,
                        "PREROUTING",
                        Position::Insert(1),
                        &["-i", iface, "-d", &cidr, "-j", ISTIO_REDIRECT],
                    );
                }
                b.nat(ISTIO_OUTPUT, &["-d", &cidr, "-j", ISTIO_REDIRECT]);
            }
        }
    }

    if tproxy {
        b.mangle(
            "PREROUTING",
            &[
                "-p",
                "tcp",
                "-m",
                "mark",
                "--mark",
                &mark,
                "-j",
                "CONNMARK",
                "--save-mark",
            ],
        );
        b.mangle(
            "OUTPUT",
            &[
                "-p", "tcp", "-o", "lo", "-m", "mark", "--mark", &mark, "-j", "RETURN",
            ],
        );
        for (kind, ids) in [("--uid-owner", &uids), ("--gid-owner", &gids)] {
            for id in ids {
                b.mangle(
                    "OUTPUT",
                    &[
                        "!",
                        "-d",
                        &loopback,
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
        }
        b.mangle(
            "OUTPUT",
            &[
                "-p",
                "tcp",
                "-m",
                "connmark",
                "--mark",
                &mark,
                "-j",
                "CONNMARK",
                "--restore-mark",
            ],
        );
        b.push(
            Table::Mangle,
            ISTIO_INBOUND,
            Position::Insert(1),
            &["-p", "tcp", "-m", "mark", "--mark", &mark, "-j", "RETURN"],
        );
        b.push(
            Table::Mangle,
            ISTIO_INBOUND,
            Position::Insert(2),
            &["-p", "tcp", "-s", passthrough, "-i", "lo", "-j", "RETURN"],
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

    Plan {
        family: b.family,
        rules: b.rules,
    }
}
