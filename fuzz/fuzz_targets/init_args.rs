//! istio-iptables' configuration from its command line and env (`istio_init::config::Config::
//! from_args`), then the rules planned and rendered from it. Any input is a config or an error
//! naming the flag or variable, never a panic; an accepted config renders, for each family, an
//! `iptables-restore` payload in which no value can start a line of its own.
//!
//! Input: the command-line words, separated by NUL bytes; then, after a 0x01 byte, env records
//! `NAME=VALUE` separated by NUL bytes.
#![no_main]

use clap::Parser;
use istio_init::config::{Args, Config};
use istio_init::plan::{Family, PodFacts, plan};
use istio_init::render::restore_payload;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (words, env) = text.split_once('\u{1}').unwrap_or((text, ""));
    let argv = std::iter::once("istio-iptables").chain(words.split('\0').filter(|w| !w.is_empty()));
    let Ok(args) = Args::try_parse_from(argv) else {
        return;
    };
    let env: Vec<(&str, &str)> = env.split('\0').filter_map(|r| r.split_once('=')).collect();
    let lookup = |k: &str| {
        env.iter()
            .rev()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| v.to_string())
    };
    let config = match Config::from_args(&args, &lookup, &|_| Some(1337)) {
        Ok(c) => c,
        Err(e) => {
            assert!(!e.to_string().is_empty());
            return;
        }
    };
    let facts = PodFacts {
        dns_servers: vec![
            "10.0.0.10".parse().expect("ip"),
            "fd00::10".parse().expect("ip"),
        ],
    };
    for family in [Family::V4, Family::V6] {
        let planned = plan(&config, family, &facts);
        let payload = restore_payload(&planned);
        for line in payload.lines() {
            assert!(
                line.starts_with("* ")
                    || line.starts_with("-N ")
                    || line.starts_with("-A ")
                    || line.starts_with("-I ")
                    || line == "COMMIT",
                "a value started a line of its own: {line:?}\n{payload}"
            );
        }
        for rule in &planned.rules {
            for arg in &rule.args {
                assert!(
                    !arg.is_empty() && !arg.chars().any(|c| c.is_whitespace() || c.is_control()),
                    "argument {arg:?} would be split or cut by iptables-restore"
                );
            }
        }
    }
});
