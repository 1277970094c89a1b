#![allow(clippy::unwrap_used)] // test code: a panic is the failure report
//! Property tests of istio-iptables' configuration from flags and env (the stable-toolchain
//! counterpart of the `init_args` fuzz target, brief enough for every test run): any values
//! are a config or an error naming the flag or variable, and an accepted config renders
//! `iptables-restore` payloads in which no value starts a line or splits an argument.

use clap::Parser;
use istio_init::config::{Args, Config};
use istio_init::plan::{Family, PodFacts, plan};
use istio_init::render::restore_payload;
use proptest::prelude::*;

/// A flag with a value of its kind (a port, a CIDR list, an interface name...), or with a
/// hostile value one time in three.
fn flag() -> impl Strategy<Value = (&'static str, String)> {
    let ports = "(\\*|[0-9]{1,5}(,[0-9]{1,5}){0,2})";
    let cidrs =
        "(\\*|)|(10\\.[0-9]{1,3}\\.0\\.0/[0-9]{1,2}|fd00::/[0-9]{1,3})(,192\\.168\\.0\\.0/16)?";
    let kinds: Vec<(&'static str, &'static str)> = vec![
        ("-p", "[0-9]{1,5}"),
        ("-z", "[0-9]{1,5}"),
        ("-u", "[0-9]{1,5}(,[0-9]{1,5})?"),
        ("-g", "[0-9]{1,5}"),
        ("-m", "(REDIRECT|TPROXY|tproxy)"),
        ("-b", ports),
        ("-d", ports),
        ("-q", ports),
        ("-o", ports),
        ("-i", cidrs),
        ("-x", cidrs),
        ("-c", "[a-z0-9]{1,8}(,[a-z0-9]{1,8})?"),
        ("-k", "[a-z0-9]{1,8}"),
        ("-t", "[0-9]{1,4}"),
    ];
    prop::sample::select(kinds).prop_flat_map(|(flag, valid)| {
        let hostile = prop_oneof![
            "\\PC{0,16}",
            "[a-z0-9]{1,8}( -j ACCEPT|\n-A X|\t|,-x)",
            "[0-9]{6,25}",
        ];
        let value = prop_oneof![2 => valid, 1 => hostile];
        value.prop_map(move |v| (flag, v))
    })
}

fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        "[0-9]{1,6}(,[0-9]{1,6}){0,3}",
        "(\\*|10\\.0\\.0\\.0/8|fd00::/[0-9]{1,3})",
        "(REDIRECT|TPROXY|true|false)",
        "[a-z0-9]{1,16}( -j ACCEPT|\n-A X)?",
        "\\PC{0,16}",
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn any_flags_are_a_config_or_a_named_error(
        flags in prop::collection::vec(flag(), 0..6),
        env in prop::collection::vec(
            (prop::sample::select(vec![
                "INBOUND_CAPTURE_PORT", "ISTIO_INBOUND_PORTS", "ISTIO_SERVICE_CIDR",
                "ISTIO_LOCAL_EXCLUDE_PORTS", "PROXY_UID", "ISTIO_EXCLUDE_INTERFACES",
                "INBOUND_TPROXY_MARK", "REDIRECT_DNS", "ISTIO_INBOUND_INTERCEPTION_MODE",
            ]), value()),
            0..3,
        ),
    ) {
        let mut argv = vec!["istio-iptables".to_string()];
        for (flag, v) in &flags {
            argv.push(format!("{flag}={v}"));
        }
        let Ok(args) = Args::try_parse_from(&argv) else {
            return Ok(());
        };
        let lookup = |k: &str| env.iter().rev().find(|(n, _)| *n == k).map(|(_, v)| v.clone());
        let config = match Config::from_args(&args, &lookup, &|_| Some(1337)) {
            Ok(c) => c,
            Err(e) => {
                let named = e.input.starts_with("--")
                    || env.iter().any(|(n, _)| e.input == format!("env {n}"));
                prop_assert!(named, "{e} names no flag or variable given");
                return Ok(());
            }
        };
        let facts = PodFacts { dns_servers: vec!["10.0.0.10".parse().unwrap()] };
        for family in [Family::V4, Family::V6] {
            let planned = plan(&config, family, &facts);
            for line in restore_payload(&planned).lines() {
                prop_assert!(
                    ["* ", "-N ", "-A ", "-I "].iter().any(|p| line.starts_with(p)) || line == "COMMIT",
                    "{line:?}"
                );
            }
            for rule in &planned.rules {
                for arg in &rule.args {
                    prop_assert!(
                        !arg.is_empty() && !arg.chars().any(|c| c.is_whitespace() || c.is_control()),
                        "{arg:?}"
                    );
                }
            }
        }
    }
}
