//! Renders plans into `iptables-restore` payloads, as Istio's `buildRestore` does: tables sorted by
//! name, `-N` for every non-builtin chain in first-seen order, rules in plan order, `COMMIT` per table.

use std::collections::BTreeMap;

use crate::plan::{Plan, Position, Rule, Table};

const BUILTIN: [&str; 5] = ["PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"];

/// Targets that are iptables verbs, not chains.
const TARGETS: [&str; 9] = [
    "RETURN", "ACCEPT", "DROP", "REJECT", "REDIRECT", "TPROXY", "MARK", "CONNMARK", "CT",
];

fn is_our_chain(name: &str) -> bool {
    !BUILTIN.contains(&name) && !TARGETS.contains(&name)
}

/// The rule as one payload line, e.g. `-A ISTIO_OUTPUT -d 127.0.0.1/32 -j RETURN`.
pub fn rule_line(rule: &Rule) -> String {
    let mut line = match rule.position {
        Position::Append => format!("-A {}", rule.chain),
        Position::Insert(n) => format!("-I {} {n}", rule.chain),
    };
    for arg in &rule.args {
        line.push(' ');
        line.push_str(arg);
    }
    line
}

/// The `iptables-restore --noflush` payload that applies `plan`.
pub fn restore_payload(plan: &Plan) -> String {
    let mut tables: BTreeMap<Table, (Vec<&str>, Vec<&Rule>)> = BTreeMap::new();
    for rule in &plan.rules {
        let (chains, rules) = tables.entry(rule.table).or_default();
        for chain in std::iter::once(rule.chain).chain(rule.jump_target()) {
            if is_our_chain(chain) && !chains.contains(&chain) {
                chains.push(chain);
            }
        }
        rules.push(rule);
    }
    let mut out = String::new();
    for (table, (chains, rules)) in tables {
        out.push_str(&format!("* {}\n", table.name()));
        for chain in chains {
            out.push_str(&format!("-N {chain}\n"));
        }
        for rule in rules {
            out.push_str(&rule_line(rule));
            out.push('\n');
        }
        out.push_str("COMMIT\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Args, Config};
    use crate::plan::{Family, PodFacts, plan};
    use clap::Parser;

    fn payload(argv: &[&str], family: Family) -> String {
        let mut full = vec!["istio-iptables"];
        full.extend_from_slice(argv);
        let args = Args::try_parse_from(full).unwrap();
        let cfg = Config::from_args(&args, &|_| None, &|_| None).unwrap();
        restore_payload(&plan(&cfg, family, &PodFacts::default()))
    }

    fn injector_args() -> Vec<&'static str> {
        let mut argv = crate::INJECTOR_ARGS.to_vec();
        argv.push("--log_output_level=default:info");
        argv
    }

    /// The rule set Istio derives for the injector's default args (reference §1.3).
    #[test]
    fn default_sidecar_payload_matches_istio() {
        let expected = "\
* nat
-N ISTIO_INBOUND
-N ISTIO_REDIRECT
-N ISTIO_IN_REDIRECT
-N ISTIO_OUTPUT
-A ISTIO_INBOUND -p tcp --dport 15008 -j RETURN
-A ISTIO_REDIRECT -p tcp -j REDIRECT --to-ports 15001
-A ISTIO_IN_REDIRECT -p tcp -j REDIRECT --to-ports 15006
-A PREROUTING -p tcp -j ISTIO_INBOUND
-A ISTIO_INBOUND -p tcp --dport 15090 -j RETURN
-A ISTIO_INBOUND -p tcp --dport 15021 -j RETURN
-A ISTIO_INBOUND -p tcp --dport 15020 -j RETURN
-A ISTIO_INBOUND -p tcp -j ISTIO_IN_REDIRECT
-A OUTPUT -j ISTIO_OUTPUT
-A ISTIO_OUTPUT -o lo -s 127.0.0.6/32 -j RETURN
-A ISTIO_OUTPUT -o lo ! -d 127.0.0.1/32 -p tcp ! --dport 15008 -m owner --uid-owner 1337 -j ISTIO_IN_REDIRECT
-A ISTIO_OUTPUT -o lo -m owner ! --uid-owner 1337 -j RETURN
-A ISTIO_OUTPUT -m owner --uid-owner 1337 -j RETURN
-A ISTIO_OUTPUT -o lo ! -d 127.0.0.1/32 -p tcp ! --dport 15008 -m owner --gid-owner 1337 -j ISTIO_IN_REDIRECT
-A ISTIO_OUTPUT -o lo -m owner ! --gid-owner 1337 -j RETURN
-A ISTIO_OUTPUT -m owner --gid-owner 1337 -j RETURN
-A ISTIO_OUTPUT -d 127.0.0.1/32 -j RETURN
-A ISTIO_OUTPUT -j ISTIO_REDIRECT
COMMIT
";
        assert_eq!(payload(&injector_args(), Family::V4), expected);
    }

    #[test]
    fn ipv6_payload_has_the_same_shape() {
        let v4 = payload(&injector_args(), Family::V4);
        let v6 = payload(&injector_args(), Family::V6);
        let normalized = v4
            .replace("127.0.0.6/32", "::6/128")
            .replace("127.0.0.1/32", "::1/128");
        assert_eq!(normalized, v6);
    }

    #[test]
    fn cidr_lists_split_by_family() {
        let v4 = payload(
            &["-i", "10.0.0.0/8,fd00::/8", "-x", "10.1.0.0/16"],
            Family::V4,
        );
        assert!(v4.contains("-A ISTIO_OUTPUT -d 10.1.0.0/16 -j RETURN"));
        assert!(v4.contains("-A ISTIO_OUTPUT -d 10.0.0.0/8 -j ISTIO_REDIRECT"));
        assert!(!v4.contains("fd00"));
        let v6 = payload(&["-i", "10.0.0.0/8,fd00::/8"], Family::V6);
        assert!(v6.contains("-A ISTIO_OUTPUT -d fd00::/8 -j ISTIO_REDIRECT"));
        assert!(!v6.contains("10.0.0.0"));
    }
}
