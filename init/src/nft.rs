//! `--native-nftables`: the same plans rendered as Istio's nftables tables and applied as one
//! `nft -f` transaction (Istio's `tools/istio-nftables`, 1.27+).
//!
//! The plan stays the single description of the capture: each family's rules are merged into
//! one list for the `inet` tables (a rule both families share, one with no address, is written
//! once; the address-bearing rules of IPv4 then IPv6 sit where Istio puts them), and each
//! iptables rule is translated into its nft statement. Istio's tables, chains, hooks and
//! priorities are kept (`inet istio-proxy-nat`, `istio-proxy-mangle`, `istio-proxy-raw`; chains
//! `prerouting`, `output`, `istio-inbound`, ...).
//!
//! Where this is stricter than Istio: the transaction deletes and recreates each of the three
//! tables (Istio flushes only the tables the new config uses, so a mangle table left by an
//! earlier TPROXY config keeps capturing); `--dry-run` prints the transaction and changes
//! nothing (Istio's nftables path ignores `--dry-run` and programs the namespace).

use std::collections::BTreeMap;
use std::io::Write;
use std::process::{Command, Stdio};

use crate::apply::ApplyError;
use crate::plan::{Family, Plan, Position, Rule, Table};

/// Istio's tables, in the order its transaction writes them.
const TABLES: [(Table, &str); 3] = [
    (Table::Nat, "istio-proxy-nat"),
    (Table::Mangle, "istio-proxy-mangle"),
    (Table::Raw, "istio-proxy-raw"),
];

/// Every table this mode may own; cleanup removes exactly these.
pub const OUR_TABLES: [&str; 3] = ["istio-proxy-nat", "istio-proxy-mangle", "istio-proxy-raw"];

/// The chains of a table in Istio's declaration order, with the base chains' hook declaration.
fn chains(table: Table) -> &'static [(&'static str, Option<&'static str>)] {
    match table {
        Table::Nat => &[
            (
                "prerouting",
                Some("type nat hook prerouting priority -100 ;"),
            ),
            ("output", Some("type nat hook output priority -100 ;")),
            ("istio-inbound", None),
            ("istio-redirect", None),
            ("istio-in-redirect", None),
            ("istio-output", None),
            ("istio-output-dns", None),
        ],
        Table::Mangle => &[
            (
                "prerouting",
                Some("type filter hook prerouting priority -150 ;"),
            ),
            ("output", Some("type route hook output priority -150 ;")),
            ("istio-divert", None),
            ("istio-tproxy", None),
            ("istio-inbound", None),
            ("istio-drop", None),
        ],
        Table::Raw => &[
            (
                "prerouting",
                Some("type filter hook prerouting priority -300 ;"),
            ),
            ("output", Some("type filter hook output priority -300 ;")),
            ("istio-inbound", None),
            ("istio-output-dns", None),
        ],
        Table::Filter => &[],
    }
}

/// The nft name of one of the plan's chains: `PREROUTING` → `prerouting`, `ISTIO_IN_REDIRECT`
/// → `istio-in-redirect`.
pub fn chain_name(chain: &str) -> String {
    chain.to_ascii_lowercase().replace('_', "-")
}

/// A rule with the family whose addresses it carries.
type Placed<'a> = (Family, &'a Rule);

/// Merges the families' plans into the one rule list of the `inet` tables, section by section
/// (`Rule::section`): IPv4's rules of a section, then IPv6's that IPv4 does not have already
/// (a rule without addresses is the same in both families and is written once).
pub fn merge(plans: &[Plan]) -> Vec<Placed<'_>> {
    let mut sections: BTreeMap<u32, Vec<Placed>> = BTreeMap::new();
    for plan in plans {
        for rule in &plan.rules {
            let section = sections.entry(rule.section).or_default();
            // Twice in one family (a DNS server listed twice) stays twice, as in Istio.
            let shared = section
                .iter()
                .any(|(family, r)| *family != plan.family && *r == rule);
            if !shared {
                section.push((plan.family, rule));
            }
        }
    }
    sections.into_values().flatten().collect()
}

/// A rule the translation does not know: a bug in the plan or here, never user input.
#[derive(Debug, thiserror::Error)]
#[error("cannot write rule {rule:?} as nftables: {why}")]
pub struct TranslateError {
    rule: String,
    why: String,
}

/// The matches and the target of one iptables rule, read from its arguments.
#[derive(Default)]
struct Parsed<'a> {
    iif: Option<&'a str>,
    oif: Option<&'a str>,
    proto: Option<&'a str>,
    saddr: Option<(bool, &'a str)>,
    daddr: Option<(bool, &'a str)>,
    sport: Option<(bool, String)>,
    dport: Option<(bool, String)>,
    ctstate: Option<String>,
    mark: Option<(bool, &'a str)>,
    connmark: Option<&'a str>,
    owners: Vec<(&'static str, bool, &'a str)>,
    target: Option<&'a str>,
    options: BTreeMap<&'a str, Option<&'a str>>,
}

/// iptables port ranges are `a:b`, nft's `a-b`; a `,` list becomes an anonymous set.
fn ports(raw: &str) -> String {
    let items: Vec<String> = raw.split(',').map(|p| p.replace(':', "-")).collect();
    if items.len() == 1 {
        items[0].clone()
    } else {
        format!("{{ {} }}", items.join(", "))
    }
}

fn parse(rule: &Rule) -> Result<Parsed<'_>, String> {
    let mut p = Parsed::default();
    let mut negate = false;
    let mut module = "";
    let mut args = rule.args.iter().map(String::as_str);
    fn value<'a>(name: &str, args: &mut impl Iterator<Item = &'a str>) -> Result<&'a str, String> {
        args.next().ok_or_else(|| format!("{name} without a value"))
    }
    while let Some(a) = args.next() {
        let neg = std::mem::take(&mut negate);
        match a {
            "!" => negate = true,
            "-i" => p.iif = Some(value(a, &mut args)?),
            "-o" => p.oif = Some(value(a, &mut args)?),
            "-p" => p.proto = Some(value(a, &mut args)?),
            "-s" => p.saddr = Some((neg, value(a, &mut args)?)),
            "-d" => p.daddr = Some((neg, value(a, &mut args)?)),
            "--sport" => p.sport = Some((neg, ports(value(a, &mut args)?))),
            "--dport" | "--dports" => p.dport = Some((neg, ports(value(a, &mut args)?))),
            "-m" => module = value(a, &mut args)?,
            "--ctstate" => p.ctstate = Some(value(a, &mut args)?.to_ascii_lowercase()),
            "--mark" if module == "connmark" => p.connmark = Some(value(a, &mut args)?),
            "--mark" if p.target.is_none() => p.mark = Some((neg, value(a, &mut args)?)),
            "--uid-owner" => p.owners.push(("skuid", neg, value(a, &mut args)?)),
            "--gid-owner" => p.owners.push(("skgid", neg, value(a, &mut args)?)),
            "-j" => p.target = Some(value(a, &mut args)?),
            "--save-mark" | "--restore-mark" if p.target.is_some() => {
                p.options.insert(a, None);
            }
            "--to-ports" | "--to-port" | "--tproxy-mark" | "--on-port" | "--set-mark"
            | "--zone"
                if p.target.is_some() =>
            {
                let v = value(a, &mut args)?;
                p.options.insert(a, Some(v));
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(p)
}

/// One rule as the nft statement after `add rule inet TABLE CHAIN `, in Istio's wording.
pub fn statement(family: Family, rule: &Rule) -> Result<String, TranslateError> {
    let fail = |why: String| TranslateError {
        rule: crate::render::rule_line(rule),
        why,
    };
    let p = parse(rule).map_err(fail)?;
    let ip = match family {
        Family::V4 => "ip",
        Family::V6 => "ip6",
    };
    let not = |neg: bool| if neg { "!= " } else { "" };
    let mut words: Vec<String> = Vec::new();
    // iptables' `eth+` (every name starting `eth`) is nft's `eth*`.
    let iface = |name: &str| match name.strip_suffix('+') {
        Some(prefix) => format!("\"{prefix}*\""),
        None => name.to_string(),
    };
    if let Some(i) = p.iif {
        words.push(format!("iifname {}", iface(i)));
    }
    if let Some(o) = p.oif {
        words.push(format!("oifname {}", iface(o)));
    }
    // Istio's nftables mode drops invalid TCP only (its iptables mode: every protocol).
    let drops_invalid = p.target == Some("ISTIO_DROP") && p.ctstate.as_deref() == Some("invalid");
    let proto = p.proto.unwrap_or(if drops_invalid { "tcp" } else { "" });
    if proto == "tcp" {
        words.push("meta l4proto tcp".into());
    }
    if let Some((neg, a)) = p.saddr {
        words.push(format!("{ip} saddr {}{a}", not(neg)));
    }
    if let Some((neg, a)) = p.daddr {
        words.push(format!("{ip} daddr {}{a}", not(neg)));
    }
    for (name, port) in [("sport", &p.sport), ("dport", &p.dport)] {
        if let Some((neg, port)) = port {
            if proto.is_empty() {
                return Err(fail(format!("--{name} without -p")));
            }
            words.push(format!("{proto} {name} {}{port}", not(*neg)));
        }
    }
    if proto == "udp" && p.sport.is_none() && p.dport.is_none() {
        words.push("meta l4proto udp".into());
    }
    if let Some(state) = &p.ctstate {
        words.push(format!("ct state {state}"));
    }
    if let Some((neg, m)) = p.mark {
        words.push(format!("mark {}{m}", not(neg)));
    }
    if let Some(m) = p.connmark {
        words.push(format!("ct mark {m}"));
    }
    for (key, neg, id) in &p.owners {
        words.push(format!("{key} {}{id}", not(*neg)));
    }
    let option = |name: &str| {
        p.options
            .get(name)
            .copied()
            .flatten()
            .ok_or_else(|| fail(format!("{} without {name}", p.target.unwrap_or_default())))
    };
    let target = match p.target {
        None => return Err(fail("no target".into())),
        Some("RETURN") => "counter return".to_string(),
        Some("ACCEPT") => "counter accept".to_string(),
        Some("DROP") => "counter drop".to_string(),
        Some("REDIRECT") => {
            let port = p
                .options
                .get("--to-ports")
                .or_else(|| p.options.get("--to-port"))
                .copied()
                .flatten()
                .ok_or_else(|| fail("REDIRECT without --to-ports".into()))?;
            format!("counter redirect to :{port}")
        }
        Some("TPROXY") => {
            let mark = option("--tproxy-mark")?;
            let mark = mark.split('/').next().unwrap_or(mark);
            format!(
                "tproxy {ip} to :{} meta mark set {mark} counter accept",
                option("--on-port")?
            )
        }
        Some("MARK") => format!("counter meta mark set {}", option("--set-mark")?),
        Some("CONNMARK") if p.options.contains_key("--save-mark") => {
            "counter ct mark set mark".to_string()
        }
        Some("CONNMARK") if p.options.contains_key("--restore-mark") => {
            "counter meta mark set ct mark".to_string()
        }
        Some("CT") => format!("counter ct zone set {}", option("--zone")?),
        Some(chain) if chain.starts_with("ISTIO_") => {
            format!("counter jump {}", chain_name(chain))
        }
        Some(other) => return Err(fail(format!("unknown target {other:?}"))),
    };
    words.push(target);
    Ok(words.join(" "))
}

/// The `nft -f` transaction that installs the plans: each of Istio's three tables deleted (when
/// present) and, if the plans put rules in it, created again with its chains and rules. One
/// transaction: the kernel takes all of it or none of it.
pub fn transaction(plans: &[Plan]) -> Result<String, TranslateError> {
    let merged = merge(plans);
    let mut out = String::new();
    for (table, name) in TABLES {
        out.push_str(&format!(
            "add table inet {name}\ndelete table inet {name}\n"
        ));
        let rules: Vec<&Placed> = merged.iter().filter(|(_, r)| r.table == table).collect();
        if rules.is_empty() {
            continue;
        }
        let mut used: Vec<String> = Vec::new();
        for (_, r) in &rules {
            used.push(chain_name(r.chain));
            if let Some(t) = r.jump_target().filter(|t| t.starts_with("ISTIO_")) {
                used.push(chain_name(t));
            }
        }
        out.push_str(&format!("add table inet {name}\n"));
        for (chain, base) in chains(table) {
            if !used.iter().any(|u| u == chain) {
                continue;
            }
            match base {
                Some(decl) => {
                    out.push_str(&format!("add chain inet {name} {chain} {{ {decl} }}\n"))
                }
                None => out.push_str(&format!("add chain inet {name} {chain}\n")),
            }
        }
        if let Some(unknown) = used
            .iter()
            .find(|u| !chains(table).iter().any(|(c, _)| c == u))
        {
            return Err(TranslateError {
                rule: unknown.clone(),
                why: format!("no such chain in Istio's {name}"),
            });
        }
        // Istio's count of rules per chain decides between `insert ... index` and `add`.
        let mut count: BTreeMap<String, u32> = BTreeMap::new();
        for (family, rule) in rules {
            let chain = chain_name(rule.chain);
            let n = count.entry(chain.clone()).or_default();
            let stmt = statement(*family, rule)?;
            match rule.position {
                Position::Insert(at) if at >= 1 && at - 1 < *n => out.push_str(&format!(
                    "insert rule inet {name} {chain} index {} {stmt}\n",
                    at - 1
                )),
                _ => out.push_str(&format!("add rule inet {name} {chain} {stmt}\n")),
            }
            *n += 1;
        }
    }
    Ok(out)
}

/// The transaction that removes Istio's three tables, present or not.
pub fn cleanup_transaction() -> String {
    OUR_TABLES
        .iter()
        .map(|t| format!("add table inet {t}\ndelete table inet {t}\n"))
        .collect()
}

#[derive(Debug, thiserror::Error)]
pub enum NftError {
    #[error(
        "--native-nftables needs the nft binary (Debian's nftables package, v1.0.1 or later): \
         {0}; install nftables, or drop --native-nftables to use iptables"
    )]
    Missing(String),
    #[error("--native-nftables needs nft v1.0.1 or later, found {0:?}")]
    TooOld(String),
    #[error(transparent)]
    Translate(#[from] TranslateError),
    #[error(transparent)]
    Apply(#[from] ApplyError),
}

/// Checks that `nft` runs and is v1.0.1 or later (as Istio's knftables demands).
pub fn check_nft() -> Result<(), NftError> {
    let out = Command::new("nft")
        .arg("--version")
        .output()
        .map_err(|e| NftError::Missing(e.to_string()))?;
    let version = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if !out.status.success() {
        return Err(NftError::Missing(format!(
            "nft --version exited {:?}",
            out.status.code()
        )));
    }
    let number = version
        .split_whitespace()
        .find_map(|w| w.strip_prefix('v'))
        .unwrap_or_default();
    let parts: Vec<u32> = number
        .split('.')
        .map(|p| p.parse().unwrap_or(0))
        .chain(std::iter::repeat(0))
        .take(3)
        .collect();
    if (parts[0], parts[1], parts[2]) < (1, 0, 1) {
        return Err(NftError::TooOld(version));
    }
    Ok(())
}

/// What a failed `nft` run means: `nft` missing, too old, or the kernel's (or nft's) refusal.
fn explain(e: ApplyError) -> NftError {
    match e {
        ApplyError::Spawn { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
            NftError::Missing(source.to_string())
        }
        failed @ ApplyError::Failed { .. } => match check_nft() {
            Err(old @ NftError::TooOld(_)) => old,
            _ => NftError::Apply(failed),
        },
        other => NftError::Apply(other),
    }
}

/// Applies `transaction` with `nft -f -` (no other process on the way: `nft` is checked only
/// when it fails).
pub fn apply(transaction: &str) -> Result<(), NftError> {
    run_nft(transaction).map_err(explain)
}

/// Runs `nft -f -` with `transaction` on stdin.
pub fn run_nft(transaction: &str) -> Result<(), ApplyError> {
    let spawn = |source| ApplyError::Spawn {
        cmd: "nft -f -".into(),
        source,
    };
    let mut child = Command::new("nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(spawn)?;
    if let Some(mut pipe) = child.stdin.take() {
        pipe.write_all(transaction.as_bytes()).map_err(spawn)?;
    }
    let out = child.wait_with_output().map_err(spawn)?;
    if out.status.success() {
        Ok(())
    } else {
        Err(ApplyError::Failed {
            cmd: "nft -f -".into(),
            code: out.status.code(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}

/// Istio's tables as they are now in this network namespace, as `nft -f` input that puts them
/// back (empty when there are none).
pub fn snapshot() -> Result<String, NftError> {
    let mut out = String::new();
    if !installed()? {
        return Ok(out);
    }
    for table in OUR_TABLES {
        let listed = Command::new("nft")
            .args(["list", "table", "inet", table])
            .output()
            .map_err(|source| {
                explain(ApplyError::Spawn {
                    cmd: format!("nft list table inet {table}"),
                    source,
                })
            })?;
        if listed.status.success() {
            out.push_str(&String::from_utf8_lossy(&listed.stdout));
        }
    }
    Ok(out)
}

/// True when any of Istio's tables is in this network namespace.
pub fn installed() -> Result<bool, NftError> {
    let out = Command::new("nft")
        .args(["list", "tables", "inet"])
        .output()
        .map_err(|source| {
            explain(ApplyError::Spawn {
                cmd: "nft list tables inet".into(),
                source,
            })
        })?;
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text.lines().any(|l| {
        l.split_whitespace()
            .last()
            .is_some_and(|t| OUR_TABLES.contains(&t))
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Args, Config};
    use crate::plan::{PodFacts, plan};
    use clap::Parser;

    fn plans(argv: &[&str], families: &[Family], facts: &PodFacts) -> Vec<Plan> {
        let mut full = vec!["istio-iptables"];
        full.extend_from_slice(argv);
        let args = Args::try_parse_from(full).unwrap();
        let cfg = Config::from_args(&args, &|_| None, &|_| None).unwrap();
        families.iter().map(|f| plan(&cfg, *f, facts)).collect()
    }

    fn injector_args() -> Vec<&'static str> {
        crate::INJECTOR_ARGS.to_vec()
    }

    /// Istio's transaction for the injector's default args (its `run.go` order, read from
    /// istio/istio release-1.31), with our delete-and-create of each table in front.
    #[test]
    fn default_sidecar_transaction_matches_istio() {
        let got = transaction(&plans(
            &injector_args(),
            &[Family::V4],
            &PodFacts::default(),
        ))
        .unwrap();
        let expected = "\
add table inet istio-proxy-nat
delete table inet istio-proxy-nat
add table inet istio-proxy-nat
add chain inet istio-proxy-nat prerouting { type nat hook prerouting priority -100 ; }
add chain inet istio-proxy-nat output { type nat hook output priority -100 ; }
add chain inet istio-proxy-nat istio-inbound
add chain inet istio-proxy-nat istio-redirect
add chain inet istio-proxy-nat istio-in-redirect
add chain inet istio-proxy-nat istio-output
add rule inet istio-proxy-nat istio-inbound meta l4proto tcp tcp dport 15008 counter return
add rule inet istio-proxy-nat istio-redirect meta l4proto tcp counter redirect to :15001
add rule inet istio-proxy-nat istio-in-redirect meta l4proto tcp counter redirect to :15006
add rule inet istio-proxy-nat prerouting meta l4proto tcp counter jump istio-inbound
add rule inet istio-proxy-nat istio-inbound meta l4proto tcp tcp dport 15090 counter return
add rule inet istio-proxy-nat istio-inbound meta l4proto tcp tcp dport 15021 counter return
add rule inet istio-proxy-nat istio-inbound meta l4proto tcp tcp dport 15020 counter return
add rule inet istio-proxy-nat istio-inbound meta l4proto tcp counter jump istio-in-redirect
add rule inet istio-proxy-nat output counter jump istio-output
add rule inet istio-proxy-nat istio-output oifname lo ip saddr 127.0.0.6/32 counter return
add rule inet istio-proxy-nat istio-output oifname lo meta l4proto tcp ip daddr != 127.0.0.1/32 tcp dport != 15008 skuid 1337 counter jump istio-in-redirect
add rule inet istio-proxy-nat istio-output oifname lo skuid != 1337 counter return
add rule inet istio-proxy-nat istio-output skuid 1337 counter return
add rule inet istio-proxy-nat istio-output oifname lo meta l4proto tcp ip daddr != 127.0.0.1/32 tcp dport != 15008 skgid 1337 counter jump istio-in-redirect
add rule inet istio-proxy-nat istio-output oifname lo skgid != 1337 counter return
add rule inet istio-proxy-nat istio-output skgid 1337 counter return
add rule inet istio-proxy-nat istio-output ip daddr 127.0.0.1/32 counter return
add rule inet istio-proxy-nat istio-output counter jump istio-redirect
add table inet istio-proxy-mangle
delete table inet istio-proxy-mangle
add table inet istio-proxy-raw
delete table inet istio-proxy-raw
";
        assert_eq!(got, expected);
    }

    /// A dual-stack pod: the shared rules once, each IPv6 rule right after its IPv4 twin.
    #[test]
    fn dual_stack_rules_sit_beside_their_ipv4_twins() {
        let got = transaction(&plans(
            &injector_args(),
            &[Family::V4, Family::V6],
            &PodFacts::default(),
        ))
        .unwrap();
        let output: Vec<&str> = got
            .lines()
            .filter_map(|l| l.strip_prefix("add rule inet istio-proxy-nat istio-output "))
            .collect();
        assert_eq!(
            output,
            [
                "oifname lo ip saddr 127.0.0.6/32 counter return",
                "oifname lo ip6 saddr ::6/128 counter return",
                "oifname lo meta l4proto tcp ip daddr != 127.0.0.1/32 tcp dport != 15008 skuid 1337 counter jump istio-in-redirect",
                "oifname lo meta l4proto tcp ip6 daddr != ::1/128 tcp dport != 15008 skuid 1337 counter jump istio-in-redirect",
                "oifname lo skuid != 1337 counter return",
                "skuid 1337 counter return",
                "oifname lo meta l4proto tcp ip daddr != 127.0.0.1/32 tcp dport != 15008 skgid 1337 counter jump istio-in-redirect",
                "oifname lo meta l4proto tcp ip6 daddr != ::1/128 tcp dport != 15008 skgid 1337 counter jump istio-in-redirect",
                "oifname lo skgid != 1337 counter return",
                "skgid 1337 counter return",
                "ip daddr 127.0.0.1/32 counter return",
                "ip6 daddr ::1/128 counter return",
                "counter jump istio-redirect",
            ]
        );
    }

    /// Every rule of TPROXY, DNS capture, exclusions and drop-invalid translates, and the
    /// mangle and raw tables get Istio's base chains.
    #[test]
    fn every_section_translates() {
        let facts = PodFacts {
            dns_servers: vec!["10.96.0.10".parse().unwrap(), "fd00::10".parse().unwrap()],
        };
        let got = transaction(&plans(
            &[
                "-m",
                "TPROXY",
                "-b",
                "*",
                "-d",
                "15090,3000:3010",
                "-i",
                "10.0.0.0/8,fd00::/8",
                "-x",
                "10.1.0.0/16",
                "-q",
                "9000",
                "-o",
                "25",
                "-c",
                "eth9",
                "-k",
                "vnet0",
                "--redirect-dns",
                "--drop-invalid",
            ],
            &[Family::V4, Family::V6],
            &facts,
        ))
        .unwrap();
        for line in [
            "add chain inet istio-proxy-mangle output { type route hook output priority -150 ; }",
            "add chain inet istio-proxy-raw output { type filter hook output priority -300 ; }",
            "add rule inet istio-proxy-mangle istio-tproxy meta l4proto tcp ip daddr != 127.0.0.1/32 tproxy ip to :15006 meta mark set 1337 counter accept",
            "add rule inet istio-proxy-mangle istio-tproxy meta l4proto tcp ip6 daddr != ::1/128 tproxy ip6 to :15006 meta mark set 1337 counter accept",
            "add rule inet istio-proxy-mangle istio-inbound meta l4proto tcp tcp dport 3000-3010 counter return",
            "add rule inet istio-proxy-mangle prerouting meta l4proto tcp ct state invalid counter jump istio-drop",
            "add rule inet istio-proxy-mangle prerouting meta l4proto tcp mark 1337 counter ct mark set mark",
            "add rule inet istio-proxy-mangle output meta l4proto tcp ct mark 1337 counter meta mark set ct mark",
            "add rule inet istio-proxy-nat istio-output oifname lo meta l4proto tcp ip daddr != 127.0.0.1/32 tcp dport != { 53, 15008 } skuid 1337 counter jump istio-in-redirect",
            "add rule inet istio-proxy-nat istio-output-dns meta l4proto tcp ip daddr 10.96.0.10/32 tcp dport 53 counter redirect to :15053",
            "add rule inet istio-proxy-nat istio-output-dns meta l4proto tcp ip6 daddr fd00::10/128 tcp dport 53 counter redirect to :15053",
            "add rule inet istio-proxy-raw istio-output-dns udp dport 53 skuid 1337 counter ct zone set 1",
            "add rule inet istio-proxy-raw istio-inbound ip saddr 10.96.0.10/32 udp sport 53 counter ct zone set 1",
            "insert rule inet istio-proxy-nat prerouting index 0 iifname vnet0 ip daddr 10.0.0.0/8 counter jump istio-redirect",
            "add rule inet istio-proxy-nat istio-output udp dport 25 counter return",
        ] {
            assert!(got.contains(&format!("{line}\n")), "{line}\nin\n{got}");
        }
        assert!(!got.contains("add chain inet istio-proxy-mangle istio-tproxy {"));
    }

    #[test]
    fn an_unknown_argument_is_named() {
        let rule = Rule {
            table: Table::Nat,
            chain: "ISTIO_OUTPUT",
            position: Position::Append,
            args: vec![
                "-m".into(),
                "comment".into(),
                "--comment".into(),
                "x".into(),
            ],
            section: 1,
        };
        let e = statement(Family::V4, &rule).unwrap_err().to_string();
        assert!(e.contains("--comment") && e.contains("ISTIO_OUTPUT"), "{e}");
    }

    #[test]
    fn cleanup_removes_the_three_tables() {
        assert_eq!(
            cleanup_transaction(),
            "add table inet istio-proxy-nat\ndelete table inet istio-proxy-nat\n\
             add table inet istio-proxy-mangle\ndelete table inet istio-proxy-mangle\n\
             add table inet istio-proxy-raw\ndelete table inet istio-proxy-raw\n"
        );
    }
}
