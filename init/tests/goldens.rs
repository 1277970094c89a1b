//! Golden tests of the rendered iptables-restore payloads for Istio's table of configurations.
//! Regenerate with `UPDATE_GOLDENS=1 cargo test -p istio-init --test goldens` and review the diff.

use std::collections::HashMap;
use std::path::PathBuf;

use clap::Parser;
use istio_init::config::{Args, Config};
use istio_init::plan::{Family, PodFacts, plan};
use istio_init::render::restore_payload;

const DEFAULT: &str = "-p 15001 -z 15006 -u 1337 -m REDIRECT -i * -b * -d 15090,15021,15020";

struct Case {
    name: &'static str,
    args: String,
    env: &'static [(&'static str, &'static str)],
    dns: &'static [&'static str],
}

fn case(name: &'static str, args: &str) -> Case {
    Case {
        name,
        args: args.to_string(),
        env: &[],
        dns: &[],
    }
}

fn cases() -> Vec<Case> {
    vec![
        case("default-sidecar", DEFAULT),
        case("tproxy", &DEFAULT.replace("REDIRECT", "TPROXY")),
        case("empty", ""),
        case("empty-inbound-ports", "-p 15001 -z 15006 -u 1337 -i * -b "),
        case("drop-invalid", &format!("{DEFAULT} --drop-invalid")),
        case("exclude-interfaces", &format!("{DEFAULT} -c eth1,eth2")),
        case(
            "exclude-interfaces-tproxy",
            &format!("{} -c eth1", DEFAULT.replace("REDIRECT", "TPROXY")),
        ),
        case(
            "ip-range",
            "-p 15001 -z 15006 -u 1337 -b * -i 10.0.0.0/8,fd00::/8 -x 10.1.0.0/16,fd00:1::/32",
        ),
        case(
            "loopback-outbound-iprange",
            "-p 15001 -u 1337 -i 127.1.2.3/32",
        ),
        case(
            "outbound-ports",
            &format!("{DEFAULT} -q 32000,31000 -o 15020,15021"),
        ),
        case("kube-virt-interfaces", &format!("{DEFAULT} -k eth1,eth2")),
        case(
            "kube-virt-interfaces-cidrs",
            "-p 15001 -u 1337 -b * -i 10.0.0.0/8 -k eth1",
        ),
        case(
            "inbound-ports-list",
            "-p 15001 -z 15006 -u 1337 -b 80,8080 -i *",
        ),
        case(
            "inbound-ports-list-tproxy",
            "-p 15001 -z 15006 -u 1337 -m TPROXY -b 80,8080 -i *",
        ),
        Case {
            dns: &["127.0.0.53", "fd00::53"],
            ..case(
                "dns-uid-gid",
                &format!(
                    "{} --redirect-dns -u 1337,3 -g 1337,4",
                    DEFAULT.replace("-u 1337 ", "")
                ),
            )
        },
        case(
            "dns-capture-all",
            &format!("{DEFAULT} --redirect-dns --capture-all-dns"),
        ),
        Case {
            env: &[("ISTIO_OUTBOUND_OWNER_GROUPS", "java,202")],
            ..case("owner-groups-include", DEFAULT)
        },
        Case {
            env: &[("ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE", "888,ftp")],
            ..case("owner-groups-exclude", DEFAULT)
        },
        Case {
            env: &[
                ("ISTIO_INBOUND_PORTS", "*"),
                ("ISTIO_LOCAL_EXCLUDE_PORTS", "22,15090,15021,15020"),
                ("ISTIO_SERVICE_CIDR", "*"),
                ("ISTIO_META_DNS_CAPTURE", "true"),
            ],
            dns: &["10.0.0.10"],
            ..case("vm-cluster-env", "")
        },
        Case {
            env: &[("ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR", "127.0.0.1/8")],
            ..case("loopback-cidr", DEFAULT)
        },
    ]
}

fn render(c: &Case) -> String {
    let mut argv = vec!["istio-iptables"];
    argv.extend(c.args.split(' ').filter(|a| !a.is_empty()));
    // "-b " with an empty value.
    if c.args.ends_with("-b ") {
        argv.push("");
    }
    let args = Args::try_parse_from(argv).expect("args parse");
    let env: HashMap<&str, &str> = c.env.iter().copied().collect();
    let cfg = Config::from_args(&args, &|k| env.get(k).map(|v| v.to_string()), &|_| None)
        .expect("config is valid");
    let facts = PodFacts {
        dns_servers: c.dns.iter().map(|s| s.parse().expect("ip")).collect(),
    };
    let mut out = String::new();
    for family in [Family::V4, Family::V6] {
        out.push_str(&format!("# {family:?}: iptables-restore --noflush\n"));
        out.push_str(&restore_payload(&plan(&cfg, family, &facts)));
    }
    out
}

#[test]
fn payloads_match_goldens() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let update = std::env::var_os("UPDATE_GOLDENS").is_some();
    let mut failures = Vec::new();
    for c in cases() {
        let got = render(&c);
        let path = dir.join(format!("{}.golden", c.name));
        if update {
            std::fs::write(&path, &got).expect("write golden");
            continue;
        }
        let want = std::fs::read_to_string(&path).unwrap_or_default();
        if got != want {
            failures.push(format!("{}:\n--- want\n{want}\n--- got\n{got}", c.name));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
