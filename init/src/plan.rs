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

/// A configuration this version cannot turn into rules yet.
#[derive(Debug, thiserror::Error)]
#[error(
    "{feature} is not supported by this version of istio-iptables yet; remove {input} to continue"
)]
pub struct Unsupported {
    pub feature: &'static str,
    pub input: &'static str,
}

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
    fn nat(&mut self, chain: &'static str, args: &[&str]) {
        self.push(Table::Nat, chain, Position::Append, args);
    }
}

/// Builds the plan for one family. Pure: reads nothing but `cfg`.
pub fn plan(cfg: &Config, family: Family) -> Result<Plan, Unsupported> {
    if cfg.mode == InterceptionMode::Tproxy {
        return Err(Unsupported {
            feature: "TPROXY inbound interception",
            input: "-m TPROXY",
        });
    }
    if cfg.redirect_dns {
        return Err(Unsupported {
            feature: "DNS capture",
            input: "--redirect-dns / ISTIO_META_DNS_CAPTURE",
        });
    }
    if cfg.drop_invalid {
        return Err(Unsupported {
            feature: "dropping INVALID packets",
            input: "--drop-invalid / INVALID_DROP",
        });
    }
    if cfg.owner_groups_include.is_some() || !cfg.owner_groups_exclude.is_empty() {
        return Err(Unsupported {
            feature: "owner-group filtering",
            input: "ISTIO_OUTBOUND_OWNER_GROUPS(_EXCLUDE)",
        });
    }

    let (loopback, passthrough) = match family {
        Family::V4 => (cfg.loopback_cidr_v4.to_string(), INBOUND_PASSTHROUGH_V4),
        Family::V6 => ("::1/128".to_string(), INBOUND_PASSTHROUGH_V6),
    };
    let of_family = |c: &&Cidr| c.is_v4() == (family == Family::V4);
    let mut b = Builder {
        family,
        rules: Vec::new(),
    };
    let tunnel = cfg.inbound_tunnel_port.to_string();
    let proxy_port = cfg.proxy_port.to_string();
    let capture_port = cfg.inbound_capture_port.to_string();

    for iface in &cfg.exclude_interfaces {
        b.nat("PREROUTING", &["-i", iface, "-j", "RETURN"]);
        b.nat("OUTPUT", &["-o", iface, "-j", "RETURN"]);
    }
    for iface in &cfg.kube_virt_interfaces {
        b.push(
            Table::Nat,
            "PREROUTING",
            Position::Insert(1),
            &["-i", iface, "-j", "RETURN"],
        );
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

    match &cfg.inbound {
        InboundPorts::None => {}
        InboundPorts::All { exclude } => {
            b.nat("PREROUTING", &["-p", "tcp", "-j", ISTIO_INBOUND]);
            for port in exclude {
                let port = port.to_string();
                b.nat(
                    ISTIO_INBOUND,
                    &["-p", "tcp", "--dport", &port, "-j", "RETURN"],
                );
            }
            b.nat(ISTIO_INBOUND, &["-p", "tcp", "-j", ISTIO_IN_REDIRECT]);
        }
        InboundPorts::Only(ports) => {
            b.nat("PREROUTING", &["-p", "tcp", "-j", ISTIO_INBOUND]);
            for port in ports {
                let port = port.to_string();
                b.nat(
                    ISTIO_INBOUND,
                    &["-p", "tcp", "--dport", &port, "-j", ISTIO_IN_REDIRECT],
                );
            }
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

    let capture_inbound = cfg.inbound != InboundPorts::None;
    let owners = cfg
        .proxy_uids
        .iter()
        .map(|u| ("--uid-owner", u.to_string()))
        .chain(
            cfg.proxy_gids
                .iter()
                .map(|g| ("--gid-owner", g.to_string())),
        );
    for (kind, id) in owners {
        if capture_inbound {
            // The app calling itself through a service VIP: Envoy's outbound connection to the
            // pod's own address goes over lo and must be treated as inbound.
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
                    &id,
                    "-j",
                    ISTIO_IN_REDIRECT,
                ],
            );
        }
        b.nat(
            ISTIO_OUTPUT,
            &["-o", "lo", "-m", "owner", "!", kind, &id, "-j", "RETURN"],
        );
        b.nat(ISTIO_OUTPUT, &["-m", "owner", kind, &id, "-j", "RETURN"]);
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
            for iface in &cfg.kube_virt_interfaces {
                b.push(
                    Table::Nat,
                    "PREROUTING",
                    Position::Insert(1),
                    &["-i", iface, "-j", ISTIO_REDIRECT],
                );
            }
            b.nat(ISTIO_OUTPUT, &["-j", ISTIO_REDIRECT]);
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

    Ok(Plan {
        family: b.family,
        rules: b.rules,
    })
}
