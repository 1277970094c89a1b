#![allow(clippy::unwrap_used)] // test code: a panic is the failure report
//! Istio's own istio-iptables (`pilot-agent istio-iptables` of the release-1.31 build that
//! `scripts/install-istio.sh` installs) as the oracle for ours. Each case runs both tools with
//! `--dry-run` in a network namespace with chosen addresses (Istio picks the IP families from
//! them), parses both outputs into the rule sets `iptables-restore` would see (per family and
//! table: the chains declared, as a set, and the `-A`/`-I` rules in order, whitespace collapsed),
//! and compares them with the exit codes. A case matches Istio, or differs exactly as its
//! `Expect` says: a new or changed difference fails, naming the case with its argv and env.
//!
//! The matrix: hand-picked cases (the injector's args, the annotations and mesh env it turns into
//! them, Istio 1.5's args, VM env files), every pair of values over 22 dimensions, every triple
//! over the 14 dimensions that interact (inbound mode and ports, outbound CIDRs and ports,
//! interfaces, owners, DNS, IP families), and probes that each pin one difference, fixed or kept.
//! docs/conformance.md "Istio's istio-iptables as the oracle" lists the kept differences and why.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Instant, SystemTime};

use harness::istio::istio_bin;
use harness::{INJECTOR_INIT_ARGS, PREFIX, binary, cannot_run, run, sweep_stale};

// ---------------------------------------------------------------------------------------------
// Cases

/// The addresses of a case's network namespace (besides lo), on an interface with no link to
/// anything: Istio turns IPv6 on from them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Addrs {
    V4,
    V6,
    Dual,
    /// lo only: Istio finds no address and exits 1.
    LoOnly,
}

impl Addrs {
    fn cidrs(self) -> &'static [&'static str] {
        match self {
            Addrs::V4 => &["10.77.0.2/24"],
            Addrs::V6 => &["fd00:77::2/64"],
            Addrs::Dual => &["10.77.0.2/24", "fd00:77::2/64"],
            Addrs::LoOnly => &[],
        }
    }
}

/// The namespace's /etc/resolv.conf (read for DNS capture without --capture-all-dns).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Resolv {
    OneV4,
    TwoV4,
    OneV6,
    V4V6,
    NoServer,
    Duplicate,
    Mapped,
    LinkLocal,
    /// A link-local server with its zone.
    Zoned,
}

impl Resolv {
    fn text(self) -> &'static str {
        match self {
            Resolv::OneV4 => {
                "search default.svc.cluster.local svc.cluster.local cluster.local\n\
                 nameserver 10.96.0.10\noptions ndots:5\n"
            }
            Resolv::TwoV4 => "nameserver 10.96.0.10\nnameserver 127.0.0.53\n",
            Resolv::OneV6 => "nameserver fd00::10\n",
            Resolv::V4V6 => "nameserver 10.96.0.10\nnameserver fd00::10\n",
            Resolv::NoServer => "search cluster.local\noptions ndots:5\n",
            Resolv::Duplicate => "nameserver 10.96.0.10\nnameserver 10.96.0.10\n",
            Resolv::Mapped => "nameserver ::ffff:10.96.0.10\n",
            Resolv::LinkLocal => "nameserver 10.96.0.10\nnameserver fe80::1\n",
            Resolv::Zoned => "nameserver 10.96.0.10\nnameserver fe80::1%eth0\n",
        }
    }
}

/// A change to a case: how ours reads a case, in Istio's terms.
#[derive(Clone, Copy, Debug)]
enum Edit {
    /// The first argv word `.0` becomes `.1`.
    Arg(&'static str, &'static str),
    /// The first argv word equal to this one goes.
    DropArg(&'static str),
    /// This word is appended.
    Push(&'static str),
    Env(&'static str, &'static str),
    Unenv(&'static str),
    Resolv(Resolv),
    Addrs(Addrs),
}

/// What a case must show.
#[derive(Clone, Copy, Debug)]
enum Expect {
    /// The same rules as Istio, both exiting 0.
    Same,
    /// Kept: ours refuses (exit `code`, its error naming `names`) what Istio applies (exit 0).
    OursRefuses { code: i32, names: &'static str },
    /// Kept: Istio refuses (exit 1) what ours applies, as Istio applies the case edited so.
    IstioRefuses(&'static [Edit]),
    /// Kept: both apply, differently: ours as Istio applies the case edited so.
    ReadsAs(&'static [Edit]),
    /// Both refuse, with these exit codes (kept when they differ).
    Codes { istio: i32, ours: i32 },
}

impl Expect {
    fn kind(self) -> &'static str {
        match self {
            Expect::Same => "same as Istio",
            Expect::OursRefuses { .. } => "kept: ours refuses, Istio applies",
            Expect::IstioRefuses(_) => "kept: Istio refuses, ours applies",
            Expect::ReadsAs(_) => "kept: both apply, ours reads the input otherwise",
            Expect::Codes { istio, ours } if istio == ours => "both refuse alike",
            Expect::Codes { .. } => "kept: both refuse, other exit codes",
        }
    }
}

/// Both refuse, exiting `code`.
fn both_refuse(code: i32) -> Expect {
    Expect::Codes {
        istio: code,
        ours: code,
    }
}

/// Kept: ours refuses a value (exit 1), naming the flag or variable.
fn refuses(names: &'static str) -> Expect {
    Expect::OursRefuses { code: 1, names }
}

#[derive(Clone, Debug)]
struct Case {
    name: String,
    argv: Vec<String>,
    env: Vec<(String, String)>,
    addrs: Addrs,
    resolv: Resolv,
    expect: Expect,
}

/// Words as a shell splits them, for single quotes: `-x '' -i '*'`.
fn sh(line: &str) -> Vec<String> {
    let (mut words, mut word, mut quoted, mut started) = (Vec::new(), String::new(), false, false);
    for ch in line.chars() {
        match ch {
            '\'' => (quoted, started) = (!quoted, true),
            ' ' if !quoted => {
                if started {
                    words.push(std::mem::take(&mut word));
                }
                started = false;
            }
            _ => (word.push(ch), started = true).0,
        }
    }
    assert!(!quoted, "unbalanced quote in {line:?}");
    if started {
        words.push(word);
    }
    words
}

/// A case in a v4 pod; `argv` as a shell line.
fn case(name: &str, argv: &str) -> Case {
    Case {
        name: name.to_string(),
        argv: sh(argv),
        env: Vec::new(),
        addrs: Addrs::V4,
        resolv: Resolv::OneV4,
        expect: Expect::Same,
    }
}

/// The injector's args, as in an injected pod (its log flag included).
fn injector() -> Vec<String> {
    let mut argv: Vec<String> = INJECTOR_INIT_ARGS.iter().map(|a| a.to_string()).collect();
    argv.push("--log_output_level=default:info".into());
    argv
}

/// A case on top of the injector's args; `extra` as a shell line.
fn on_injector(name: &str, extra: &str) -> Case {
    let mut c = case(name, extra);
    c.argv.splice(0..0, injector());
    c
}

/// The injector's args in TPROXY mode, plus `extra`.
fn on_tproxy(name: &str, extra: &str) -> Case {
    let mut c = on_injector(name, extra);
    let mode = c.argv.iter().position(|a| a == "REDIRECT").unwrap();
    c.argv[mode] = "TPROXY".into();
    c
}

/// A VM: `pilot-agent istio-iptables` without args, cluster.env's variables in its env.
fn vm(name: &str) -> Case {
    case(name, "")
        .env("ISTIO_INBOUND_PORTS", "8000")
        .env("ISTIO_LOCAL_EXCLUDE_PORTS", "22,15090,15021,15020")
        .env("ISTIO_META_DNS_CAPTURE", "true")
        .env("ISTIO_SERVICE_CIDR", "*")
}

impl Case {
    fn env(mut self, name: &str, value: &str) -> Case {
        self.env.retain(|(n, _)| n != name);
        self.env.push((name.to_string(), value.to_string()));
        self
    }
    fn net(mut self, addrs: Addrs) -> Case {
        self.addrs = addrs;
        self
    }
    fn resolv(mut self, resolv: Resolv) -> Case {
        self.resolv = resolv;
        self
    }
    fn expect(mut self, expect: Expect) -> Case {
        self.expect = expect;
        self
    }

    fn edited(&self, edits: &[Edit]) -> Case {
        let mut c = self.clone();
        c.name = format!("{} (as ours reads it)", self.name);
        let find = |c: &Case, word: &str| {
            c.argv
                .iter()
                .position(|a| a == word)
                .unwrap_or_else(|| panic!("{}: no argv word {word:?} to edit", self.name))
        };
        for edit in edits {
            match *edit {
                Edit::Arg(from, to) => {
                    let i = find(&c, from);
                    c.argv[i] = to.to_string();
                }
                Edit::DropArg(word) => {
                    let i = find(&c, word);
                    c.argv.remove(i);
                }
                Edit::Push(word) => c.argv.push(word.to_string()),
                Edit::Env(name, value) => c = c.env(name, value),
                Edit::Unenv(name) => c.env.retain(|(n, _)| n != name),
                Edit::Resolv(r) => c.resolv = r,
                Edit::Addrs(a) => c.addrs = a,
            }
        }
        c
    }

    fn describe(&self) -> String {
        let argv: Vec<String> = self.argv.iter().map(|a| quote(a)).collect();
        let env: Vec<String> = self
            .env
            .iter()
            .map(|(n, v)| format!("{n}={}", quote(v)))
            .collect();
        format!(
            "case {} (netns {:?}, resolv.conf {:?})\n    argv: {}\n    env:  {}\n    expected: {:?}",
            self.name,
            self.addrs,
            self.resolv,
            argv.join(" "),
            env.join(" "),
            self.expect
        )
    }
}

/// A word as a shell would need it written.
fn quote(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./:=,+@%".contains(&b));
    if plain {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

// ---------------------------------------------------------------------------------------------
// The generated part: dimensions and covering arrays

/// A flag of istio-iptables: its short and long name, its env var, and a different valid value
/// for the env var when a row gives both (the command line must win).
#[derive(Clone, Copy, Debug)]
struct Flag {
    short: char,
    long: &'static str,
    env: Option<&'static str>,
    decoy: &'static str,
}

const fn flag(short: char, long: &'static str, env: &'static str, decoy: &'static str) -> Flag {
    Flag {
        short,
        long,
        env: Some(env),
        decoy,
    }
}

#[rustfmt::skip]
mod flags {
    use super::{Flag, flag};
    pub const P: Flag = Flag { short: 'p', long: "envoy-port", env: None, decoy: "" };
    pub const Z: Flag = flag('z', "inbound-capture-port", "INBOUND_CAPTURE_PORT", "16106");
    pub const E: Flag = flag('e', "inbound-tunnel-port", "INBOUND_TUNNEL_PORT", "16108");
    pub const U: Flag = flag('u', "proxy-uid", "PROXY_UID", "4000");
    pub const G: Flag = flag('g', "proxy-gid", "PROXY_GID", "4001");
    pub const M: Flag = flag('m', "istio-inbound-interception-mode", "ISTIO_INBOUND_INTERCEPTION_MODE", "TPROXY");
    pub const B: Flag = flag('b', "istio-inbound-ports", "ISTIO_INBOUND_PORTS", "7777");
    pub const D: Flag = flag('d', "istio-local-exclude-ports", "ISTIO_LOCAL_EXCLUDE_PORTS", "7778");
    pub const I: Flag = flag('i', "istio-service-cidr", "ISTIO_SERVICE_CIDR", "192.0.2.0/24");
    pub const X: Flag = flag('x', "istio-service-exclude-cidr", "ISTIO_SERVICE_EXCLUDE_CIDR", "198.51.100.0/24");
    pub const Q: Flag = flag('q', "istio-outbound-ports", "ISTIO_OUTBOUND_PORTS", "7779");
    pub const O: Flag = flag('o', "istio-local-outbound-ports-exclude", "ISTIO_LOCAL_OUTBOUND_PORTS_EXCLUDE", "7780");
    pub const C: Flag = flag('c', "istio-exclude-interfaces", "ISTIO_EXCLUDE_INTERFACES", "eth9");
    pub const K: Flag = flag('k', "kube-virt-interfaces", "KUBE_VIRT_INTERFACES", "net9");
    pub const T: Flag = flag('t', "istio-inbound-tproxy-mark", "ISTIO_INBOUND_TPROXY_MARK", "4242");
    pub const R: Flag = flag('r', "istio-inbound-tproxy-route-table", "ISTIO_INBOUND_TPROXY_ROUTE_TABLE", "242");
}
use flags::*;

const LOOPBACK_CIDR: &str = "ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR";
const GROUPS: &str = "ISTIO_OUTBOUND_OWNER_GROUPS";
const GROUPS_EXCLUDE: &str = "ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE";

/// How a row writes its flags.
#[derive(Clone, Copy, Debug)]
enum Form {
    /// `-i VALUE`
    Short,
    /// `-iVALUE`
    Attached,
    /// `--istio-service-cidr=VALUE`
    LongEq,
    /// `--istio-service-cidr VALUE`
    LongSep,
    /// `ISTIO_SERVICE_CIDR=VALUE` (short form for a flag without env var)
    Env,
    /// `-i VALUE` and `ISTIO_SERVICE_CIDR=<another value>`
    CliOverEnv,
}

/// One setting of a dimension value.
#[derive(Clone, Copy, Debug)]
enum Set {
    Flag(Flag, &'static str),
    Arg(&'static str),
    Env(&'static str, &'static str),
    Net(Addrs),
    Resolv(Resolv),
    Form(Form),
}

struct Dim {
    name: &'static str,
    values: Vec<Vec<Set>>,
}

fn dim(name: &'static str, values: Vec<Vec<Set>>) -> Dim {
    Dim { name, values }
}

/// A dimension of one flag: absent, then each value.
fn flag_dim(flag: Flag, values: &[&'static str]) -> Dim {
    let mut all = vec![Vec::new()];
    all.extend(values.iter().map(|v| vec![Set::Flag(flag, v)]));
    Dim {
        name: flag.long,
        values: all,
    }
}

/// A dimension of settings: absent, then each value.
fn set_dim(name: &'static str, values: &[&[Set]]) -> Dim {
    let mut all = vec![Vec::new()];
    all.extend(values.iter().map(|v| v.to_vec()));
    Dim { name, values: all }
}

/// The values of every dimension on which the two tools agree (the values where they differ on
/// purpose are probes, one each, below).
fn pairwise_dims() -> Vec<Dim> {
    use Addrs::{Dual, V4, V6};
    use Set::{Arg, Env, Net};
    let resolvs = [
        Resolv::OneV4,
        Resolv::TwoV4,
        Resolv::OneV6,
        Resolv::V4V6,
        Resolv::NoServer,
        Resolv::Duplicate,
        Resolv::Mapped,
        Resolv::LinkLocal,
    ];
    let forms = [
        Form::Short,
        Form::Attached,
        Form::LongEq,
        Form::LongSep,
        Form::Env,
        Form::CliOverEnv,
    ];
    vec![
        dim(
            "netns and dual-stack",
            [
                &[Net(V4)][..],
                &[Net(V4), Arg("--dual-stack")],
                &[Net(V4), Env("ISTIO_DUAL_STACK", "true")],
                &[Net(V6)],
                &[Net(V6), Env("DUAL_STACK", "true")],
                &[Net(V6), Arg("--dual-stack=true")],
                &[Net(Dual), Arg("--dual-stack")],
                &[Net(Dual), Env("ISTIO_DUAL_STACK", "true")],
                &[Net(Dual), Env("DUAL_STACK", "true")],
                &[
                    Net(Dual),
                    Env("DUAL_STACK", "false"),
                    Env("ISTIO_DUAL_STACK", "1"),
                ],
            ]
            .iter()
            .map(|v| v.to_vec())
            .collect(),
        ),
        set_dim(
            "-p -z -e",
            &[
                &[
                    Set::Flag(P, "15001"),
                    Set::Flag(Z, "15006"),
                    Set::Flag(E, "15008"),
                ],
                &[
                    Set::Flag(P, "15101"),
                    Set::Flag(Z, "15106"),
                    Set::Flag(E, "15009"),
                ],
                &[
                    Env("INBOUND_CAPTURE_PORT", "16006"),
                    Env("INBOUND_TUNNEL_PORT", "16008"),
                ],
            ],
        ),
        {
            let mut d = flag_dim(U, &["1337", "0", "1337,1338", "1337, 1338"]);
            d.values.extend([
                vec![Env("PROXY_UID", "2000")],
                vec![Env("ENVOY_USER", "root")],
                vec![Env("ENVOY_USER", "no-such-user")],
            ]);
            d
        },
        {
            let mut d = flag_dim(G, &["", "1337", "1337,3000"]);
            d.values.push(vec![Env("PROXY_GID", "3000")]);
            d
        },
        {
            let mut d = flag_dim(M, &["", "REDIRECT", "TPROXY"]);
            d.values
                .push(vec![Env("ISTIO_INBOUND_INTERCEPTION_MODE", "TPROXY")]);
            d
        },
        flag_dim(
            B,
            &[
                "",
                "*",
                "80",
                "80,8080,9090",
                "80, 8080",
                "80,,8080,",
                ",",
                "3000:3010",
            ],
        ),
        flag_dim(
            D,
            &["", "15090,15021,15020", "15020", "22, 15020", "8000:8100"],
        ),
        flag_dim(
            I,
            &[
                "",
                "*",
                "10.0.0.0/8",
                "10.0.0.0/8,172.16.0.0/12",
                "fd00::/8",
                "10.0.0.0/8,fd00::/8",
                "127.0.0.1/32",
                "::1/128",
                "2001:DB8:0:0::/32",
                "10.1.2.3/8",
                "0.0.0.0/0,::/0",
                ",",
            ],
        ),
        flag_dim(
            X,
            &[
                "",
                "10.96.0.0/12",
                "169.254.169.254/32,fd00:1::/32",
                "192.168.0.0/16,10.1.0.0/16",
            ],
        ),
        flag_dim(Q, &["", "443", "443,8443", "3000:3010"]),
        flag_dim(O, &["", "15020", "22,3306", "22, 3306", "5000:5010"]),
        flag_dim(C, &["", "eth1", "eth1,veth+", " eth1"]),
        flag_dim(K, &["", "net1", "net1,net2"]),
        set_dim(
            "-t -r",
            &[
                &[Set::Flag(T, "1337")],
                &[Set::Flag(T, "2000")],
                &[Set::Flag(R, "200")],
                &[Set::Flag(T, "2000"), Set::Flag(R, "200")],
            ],
        ),
        set_dim(
            "DNS capture",
            &[
                &[Arg("--redirect-dns")],
                &[Arg("--redirect-dns=true")],
                &[Env("ISTIO_META_DNS_CAPTURE", "true")],
                &[Env("REDIRECT_DNS", "true")],
                &[Arg("--redirect-dns=false")],
                &[
                    Env("ISTIO_META_DNS_CAPTURE", "true"),
                    Env("REDIRECT_DNS", "false"),
                ],
                &[
                    Env("ISTIO_META_DNS_CAPTURE", "false"),
                    Env("REDIRECT_DNS", "true"),
                ],
            ],
        ),
        set_dim(
            "--capture-all-dns",
            &[
                &[Arg("--capture-all-dns")],
                &[Env("CAPTURE_ALL_DNS", "true")],
            ],
        ),
        dim(
            "resolv.conf",
            resolvs.iter().map(|r| vec![Set::Resolv(*r)]).collect(),
        ),
        set_dim(
            "--drop-invalid",
            &[
                &[Arg("--drop-invalid")],
                &[Env("INVALID_DROP", "true")],
                &[Env("DROP_INVALID", "true")],
                &[Env("INVALID_DROP", "false"), Env("DROP_INVALID", "true")],
            ],
        ),
        set_dim(
            LOOPBACK_CIDR,
            &[
                &[Env(LOOPBACK_CIDR, "127.0.0.1/32")],
                &[Env(LOOPBACK_CIDR, "127.0.0.1/8")],
                &[Env(LOOPBACK_CIDR, "127.0.0.0/16")],
                &[Env(LOOPBACK_CIDR, "127.10.0.1/32")],
            ],
        ),
        set_dim(
            "owner groups",
            &[
                &[Env(GROUPS, "*"), Env(GROUPS_EXCLUDE, "1001")],
                &[Env(GROUPS, "*"), Env(GROUPS_EXCLUDE, "1001,1002")],
                &[Env(GROUPS, "1001")],
                &[Env(GROUPS, "1001,2002"), Env(GROUPS_EXCLUDE, "3003")],
                &[Env(GROUPS_EXCLUDE, "1001")],
                &[Env(GROUPS, "java,202")],
            ],
        ),
        dim(
            "flag form",
            forms.iter().map(|f| vec![Set::Form(*f)]).collect(),
        ),
        set_dim(
            "no-op extras",
            &[
                &[Arg("--log_output_level=default:info")],
                &[Arg("--reconcile")],
                &[Arg("--force-apply")],
                &[Arg("--force-iptables-binary=nft")],
                &[Env("FORCE_IPTABLES_BINARY", "legacy")],
                &[Arg("--log_as_json")],
                &[Arg("--log_caller=default"), Arg("--log_target=stdout")],
                // A repeated flag: the last value wins.
                &[Arg("-z"), Arg("15007")],
            ],
        ),
    ]
}

/// The dimensions that interact, for every triple of their values.
fn core_dims() -> Vec<Dim> {
    use Set::{Arg, Env, Net};
    let mut mode = flag_dim(M, &["TPROXY"]);
    mode.values
        .push(vec![Env("ISTIO_INBOUND_INTERCEPTION_MODE", "TPROXY")]);
    vec![
        mode,
        flag_dim(B, &["*", "80,8080"]),
        flag_dim(D, &["15090,15021,15020", "8000:8100"]),
        flag_dim(I, &["*", "10.0.0.0/8,fd00::/8", "127.0.0.1/32"]),
        flag_dim(X, &["10.96.0.0/12,fd00:1::/32"]),
        flag_dim(K, &["net1"]),
        flag_dim(C, &["eth1"]),
        flag_dim(O, &["22,3000:3010"]),
        set_dim("-u -g", &[&[Set::Flag(U, "1337,0"), Set::Flag(G, "3000")]]),
        set_dim(
            "DNS capture",
            &[
                &[Arg("--redirect-dns")],
                &[Env("ISTIO_META_DNS_CAPTURE", "true")],
            ],
        ),
        set_dim("--capture-all-dns", &[&[Arg("--capture-all-dns")]]),
        set_dim("--drop-invalid", &[&[Arg("--drop-invalid")]]),
        dim(
            "resolv.conf",
            [Resolv::OneV4, Resolv::V4V6, Resolv::NoServer]
                .iter()
                .map(|r| vec![Set::Resolv(*r)])
                .collect(),
        ),
        dim(
            "netns",
            vec![
                vec![Net(Addrs::V4)],
                vec![Net(Addrs::V6)],
                vec![Net(Addrs::Dual), Arg("--dual-stack")],
            ],
        ),
    ]
}

/// All `k`-element subsets of `items`, in order.
fn subsets(items: &[usize], k: usize) -> Vec<Vec<usize>> {
    if k == 0 {
        return vec![Vec::new()];
    }
    let mut out = Vec::new();
    for (i, &first) in items.iter().enumerate() {
        for mut rest in subsets(&items[i + 1..], k - 1) {
            rest.insert(0, first);
            out.push(rest);
        }
    }
    out
}

type Tuple = Vec<(usize, usize)>;

/// Every `t`-tuple of values of `t` different dimensions (dimension `d` has `sizes[d]` values).
fn all_tuples(sizes: &[usize], t: usize) -> BTreeSet<Tuple> {
    let dims: Vec<usize> = (0..sizes.len()).collect();
    let mut out = BTreeSet::new();
    for set in subsets(&dims, t) {
        let mut partial: Vec<Tuple> = vec![Vec::new()];
        for &d in &set {
            partial = partial
                .into_iter()
                .flat_map(|p| {
                    (0..sizes[d]).map(move |v| {
                        let mut p = p.clone();
                        p.push((d, v));
                        p
                    })
                })
                .collect();
        }
        out.extend(partial);
    }
    out
}

/// Rows (a value index per dimension) in which every `t`-tuple of values appears: greedy, each
/// row seeded with the first tuple still missing, every other dimension given the value that
/// completes the most missing tuples (ties: the value used least so far). Deterministic.
fn covering_array(sizes: &[usize], t: usize) -> Vec<Vec<usize>> {
    let mut missing = all_tuples(sizes, t);
    let mut used: Vec<Vec<usize>> = sizes.iter().map(|&n| vec![0; n]).collect();
    let mut rows = Vec::new();
    while let Some(seed) = missing.iter().next().cloned() {
        let mut row: Vec<Option<usize>> = vec![None; sizes.len()];
        for &(d, v) in &seed {
            row[d] = Some(v);
        }
        for d in 0..sizes.len() {
            if row[d].is_some() {
                continue;
            }
            let assigned: Vec<usize> = (0..sizes.len()).filter(|&e| row[e].is_some()).collect();
            let others = subsets(&assigned, t - 1);
            let gain = |v: usize| {
                others
                    .iter()
                    .filter(|set| {
                        let mut tuple: Tuple = set.iter().map(|&e| (e, row[e].unwrap())).collect();
                        tuple.push((d, v));
                        tuple.sort_unstable();
                        missing.contains(&tuple)
                    })
                    .count()
            };
            let best = (0..sizes[d])
                .max_by_key(|&v| (gain(v), std::cmp::Reverse(used[d][v]), std::cmp::Reverse(v)))
                .unwrap();
            row[d] = Some(best);
        }
        let row: Vec<usize> = row.into_iter().map(Option::unwrap).collect();
        for set in subsets(&(0..sizes.len()).collect::<Vec<_>>(), t) {
            let tuple: Tuple = set.iter().map(|&d| (d, row[d])).collect();
            missing.remove(&tuple);
        }
        for (d, &v) in row.iter().enumerate() {
            used[d][v] += 1;
        }
        rows.push(row);
    }
    rows
}

/// The case a row of dimension values makes.
fn render_row(name: String, dims: &[Dim], row: &[usize]) -> Case {
    let sets: Vec<Set> = dims
        .iter()
        .zip(row)
        .flat_map(|(d, &v)| d.values[v].iter().copied())
        .collect();
    let form = sets
        .iter()
        .find_map(|s| match s {
            Set::Form(f) => Some(*f),
            _ => None,
        })
        .unwrap_or(Form::Short);
    let mut c = case(&name, "");
    let mut argv: Vec<String> = Vec::new();
    for s in sets {
        match s {
            Set::Flag(flag, value) => {
                let short = format!("-{}", flag.short);
                match (form, flag.env) {
                    (Form::Env, Some(var)) => c = c.env(var, value),
                    (Form::Short | Form::Env, _) => argv.extend([short, value.to_string()]),
                    // An empty value must be a word of its own.
                    (Form::Attached, _) if value.is_empty() => {
                        argv.extend([short, String::new()]);
                    }
                    (Form::Attached, _) => argv.push(format!("{short}{value}")),
                    (Form::LongEq, _) => argv.push(format!("--{}={value}", flag.long)),
                    (Form::LongSep, _) => {
                        argv.extend([format!("--{}", flag.long), value.to_string()]);
                    }
                    (Form::CliOverEnv, var) => {
                        argv.extend([short, value.to_string()]);
                        if let Some(var) = var {
                            c = c.env(var, flag.decoy);
                        }
                    }
                }
            }
            Set::Arg(word) => argv.push(word.to_string()),
            Set::Env(name, value) => c = c.env(name, value),
            Set::Net(a) => c.addrs = a,
            Set::Resolv(r) => c.resolv = r,
            Set::Form(_) => {}
        }
    }
    c.argv = argv;
    c
}

fn generated(prefix: &str, dims: &[Dim], t: usize) -> Vec<Case> {
    let sizes: Vec<usize> = dims.iter().map(|d| d.values.len()).collect();
    let rows = covering_array(&sizes, t);
    // The array is checked, not trusted: every t-tuple appears in some row.
    for tuple in all_tuples(&sizes, t) {
        assert!(
            rows.iter()
                .any(|row| tuple.iter().all(|&(d, v)| row[d] == v)),
            "{prefix}: tuple {tuple:?} of {:?} not covered",
            tuple.iter().map(|&(d, _)| dims[d].name).collect::<Vec<_>>()
        );
    }
    rows.iter()
        .enumerate()
        .map(|(i, row)| render_row(format!("{prefix}/{i:03}"), dims, row))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Hand-picked cases and probes

/// What an injected pod's istio-init gets: the injector's args (with the annotation-driven
/// changes), the mesh's proxyMetadata as env; and what a VM's gets from cluster.env.
fn curated() -> Vec<Case> {
    let mut cases = vec![
        on_injector("injector/default", ""),
        on_injector("injector/default-v6-pod", "").net(Addrs::V6),
        on_injector("injector/default-dual-stack-pod", "")
            .net(Addrs::Dual)
            .env("ISTIO_DUAL_STACK", "true"),
        case(
            "injector/no-log-flag",
            "-p 15001 -z 15006 -u 1337 -m REDIRECT -i '*' -x '' -b '*' -d 15090,15021,15020",
        ),
        // Istio 1.5's template: the same flags, before the 15021 health port.
        case(
            "injector/istio-1.5",
            "-p 15001 -z 15006 -u 1337 -m REDIRECT -i '*' -x '' -b '*' -d 15090,15020",
        ),
        // `global.logAsJson`
        on_injector("injector/log-as-json", "--log_as_json"),
        // The status port moved to 15030 (`status.sidecar.istio.io/port`).
        case(
            "injector/status-port-15030",
            "-p 15001 -z 15006 -u 1337 -m REDIRECT -i '*' -x '' -b '*' -d 15090,15021,15030 \
             --log_output_level=default:info",
        ),
        case("empty/v4-pod", ""),
        case("empty/v6-pod", "").net(Addrs::V6),
        case("empty/dual-stack-pod", "--dual-stack").net(Addrs::Dual),
    ];
    // Annotations, as the injector writes them (each replaces its flag's value or adds the flag).
    let annotations: [(&str, &[(&str, &str)]); 8] = [
        (
            "include-exclude-ranges",
            &[("-i", "10.0.0.0/8,fd00::/8"), ("-x", "169.254.169.254/32")],
        ),
        ("inbound-ports", &[("-b", "9080,9090")]),
        ("exclude-inbound-22", &[("-d", "15090,15021,22,15020")]),
        ("outbound-ports", &[("-q", "8443"), ("-o", "3306")]),
        ("kubevirt", &[("-k", "net1")]),
        ("reroute-virtual-interfaces", &[("-k", "net1,net2")]),
        ("exclude-interfaces", &[("-c", "eth1")]),
        ("tproxy", &[("-m", "TPROXY")]),
    ];
    // The mesh's proxyMetadata the init container gets as env.
    type Mesh = fn(Case) -> Case;
    let mesh_env: [(&str, Mesh); 4] = [
        ("", |c| c),
        ("+dns-capture", |c| c.env("ISTIO_META_DNS_CAPTURE", "true")),
        ("+dual-stack", |c| {
            c.env("ISTIO_DUAL_STACK", "true").net(Addrs::Dual)
        }),
        ("+invalid-drop", |c| c.env("INVALID_DROP", "true")),
    ];
    for (name, flags) in annotations {
        for (suffix, mesh) in mesh_env {
            let mut c = on_injector(&format!("annotation/{name}{suffix}"), "");
            for (flag, value) in flags {
                match c.argv.iter().position(|a| a == flag) {
                    Some(i) => c.argv[i + 1] = value.to_string(),
                    None => c.argv.extend([flag.to_string(), value.to_string()]),
                }
            }
            let c = mesh(c);
            cases.push(c);
        }
    }
    cases.extend([
        vm("vm/cluster-env"),
        vm("vm/cluster-env-dual-stack-host")
            .net(Addrs::Dual)
            .env("ISTIO_DUAL_STACK", "true"),
        vm("vm/cluster-env-v6-host").net(Addrs::V6),
        vm("vm/tproxy").env("ISTIO_INBOUND_INTERCEPTION_MODE", "TPROXY"),
        vm("vm/all-inbound")
            .env("ISTIO_INBOUND_PORTS", "*")
            .env("ISTIO_SERVICE_EXCLUDE_CIDR", "10.0.0.0/8"),
        vm("vm/owner-groups").env(GROUPS_EXCLUDE, "1001"),
        vm("vm/envoy-user").env("ENVOY_USER", "root"),
    ]);
    cases
}

/// Each pins one difference: one fixed in our crate (now the same as Istio), one both tools
/// refuse alike, or one kept on purpose, asserted as exactly that difference.
fn probes() -> Vec<Case> {
    use Edit::{Arg, DropArg, Env, Push, Unenv};
    use Expect::{Codes, IstioRefuses, OursRefuses, ReadsAs};
    let groups65: &'static str = Box::leak(
        (0..65)
            .map(|i| format!("g{i}"))
            .collect::<Vec<_>>()
            .join(",")
            .into_boxed_str(),
    );
    vec![
        // Fixed: port ranges in port lists (Istio passes list items to iptables as written).
        on_injector("fixed/o-port-range", "-o 3000:3010"),
        vm("fixed/o-port-range-vm-env").env("ISTIO_LOCAL_OUTBOUND_PORTS_EXCLUDE", "3000:3010"),
        on_injector("fixed/q-port-range", "-q 3000:3010,8443"),
        case("fixed/b-port-range", "-i '*' -b 3000:3010,80"),
        on_tproxy("fixed/b-port-range-tproxy", "-b 3000:3010"),
        case(
            "fixed/d-port-range",
            "-i '*' -b '*' -d 15090,15021,15020,8000:8100",
        ),
        // Fixed: --dual-stack adds no IPv6 rules to a pod without IPv6.
        on_injector("fixed/dual-stack-v4-pod", "--dual-stack"),
        on_injector("fixed/dual-stack-env-v4-pod", "").env("ISTIO_DUAL_STACK", "true"),
        on_injector("fixed/dual-stack-primary-env-v4-pod", "").env("DUAL_STACK", "true"),
        // Fixed: Istio's other log flags, and repeated flags (the last one wins).
        on_injector(
            "fixed/log-flags",
            "--log_as_json --log_target=stdout --log_target stderr --log_caller=default \
             --log_stacktrace_level=default:none --vklog=2",
        ),
        on_injector("fixed/repeated-port", "-p 15101"),
        on_injector("fixed/repeated-list", "-d 15020"),
        on_injector("fixed/repeated-bool", "--redirect-dns --redirect-dns=false"),
        // Fixed: Istio's additional env var wins over the primary one.
        on_injector("fixed/dns-alias-wins", "")
            .env("ISTIO_META_DNS_CAPTURE", "true")
            .env("REDIRECT_DNS", "false"),
        on_injector("fixed/dns-alias-wins-off", "")
            .env("ISTIO_META_DNS_CAPTURE", "false")
            .env("REDIRECT_DNS", "true"),
        on_injector("fixed/dns-alias-empty", "")
            .env("ISTIO_META_DNS_CAPTURE", "")
            .env("REDIRECT_DNS", "true"),
        on_injector("fixed/invalid-drop-alias-wins", "")
            .env("INVALID_DROP", "true")
            .env("DROP_INVALID", "false"),
        // Fixed: an IPv4-mapped loopback address in the include list is loopback.
        on_injector(
            "fixed/v4-mapped-loopback-include",
            "-i ::ffff:127.0.0.1/128",
        ),
        on_injector(
            "fixed/v4-mapped-loopback-include-v6",
            "-i ::ffff:127.0.0.1/128",
        )
        .net(Addrs::V6),
        // Both refuse alike.
        case("both-refuse/exclude-wildcard", "-i '*' -x '*'").expect(both_refuse(1)),
        on_injector("both-refuse/cidr-prefix-33", "-i 10.0.0.0/33").expect(both_refuse(1)),
        on_injector("both-refuse/cidr-v6-prefix-129", "-x fd00::/129").expect(both_refuse(1)),
        on_injector("both-refuse/loopback-cidr-not-loopback", "")
            .env(LOOPBACK_CIDR, "10.0.0.1/32")
            .expect(both_refuse(1)),
        on_injector("both-refuse/loopback-cidr-mask-7", "")
            .env(LOOPBACK_CIDR, "127.0.0.1/7")
            .expect(both_refuse(1)),
        on_injector("both-refuse/loopback-cidr-v6", "")
            .env(LOOPBACK_CIDR, "::1/128")
            .expect(both_refuse(1)),
        on_injector("both-refuse/force-binary", "--force-iptables-binary=both")
            .expect(both_refuse(1)),
        on_injector("both-refuse/owner-groups-65", "")
            .env(GROUPS, groups65)
            .expect(both_refuse(1)),
        on_injector("both-refuse/unknown-flag", "--no-such-flag").expect(both_refuse(255)),
        on_injector("both-refuse/missing-value", "-p").expect(both_refuse(255)),
        on_injector("kept/bool-flag-word-exit-code", "--redirect-dns=yes").expect(Codes {
            istio: 255,
            ours: 1,
        }),
        // Kept: ours refuses what Istio passes on to iptables as written.
        on_injector("kept/mode-lowercase", "-m tproxy")
            .expect(refuses("--istio-inbound-interception-mode")),
        on_injector("kept/mode-none", "-m NONE")
            .expect(refuses("--istio-inbound-interception-mode")),
        vm("kept/mode-env-lowercase")
            .env("ISTIO_INBOUND_INTERCEPTION_MODE", "redirect")
            .expect(refuses("env ISTIO_INBOUND_INTERCEPTION_MODE")),
        on_injector("kept/port-zero", "-o 0")
            .expect(refuses("--istio-local-outbound-ports-exclude")),
        on_injector("kept/port-leading-zero", "-q 0443").expect(refuses("--istio-outbound-ports")),
        on_injector("kept/port-name", "-q https").expect(refuses("--istio-outbound-ports")),
        on_injector("kept/port-wildcard-in-list", "-o '*'")
            .expect(refuses("--istio-local-outbound-ports-exclude")),
        on_injector("kept/port-dash-range", "-o 3000-3010")
            .expect(refuses("--istio-local-outbound-ports-exclude")),
        on_injector("kept/port-range-reversed", "-o 3010:3000")
            .expect(refuses("--istio-local-outbound-ports-exclude")),
        case("kept/port-too-big", "-i '*' -b 80,99999").expect(refuses("--istio-inbound-ports")),
        on_injector("kept/envoy-port-zero", "-p 0").expect(refuses("--envoy-port")),
        on_injector("kept/envoy-port-range", "-p 15001:15002").expect(refuses("--envoy-port")),
        case("kept/unused-exclude-ports", "-i '*' -b 80 -d abc")
            .expect(refuses("--istio-local-exclude-ports")),
        on_injector("kept/uid-name", "-u istio-proxy").expect(refuses("--proxy-uid")),
        on_injector("kept/uid-only-comma", "-u ,").expect(refuses("--proxy-uid")),
        on_injector("kept/gid-name", "-g istio-proxy").expect(refuses("--proxy-gid")),
        on_injector("kept/interface-option", "'-c=-j ACCEPT'")
            .expect(refuses("--istio-exclude-interfaces")),
        on_injector("kept/interface-too-long", "-c averyveryverylongname")
            .expect(refuses("--istio-exclude-interfaces")),
        on_tproxy("kept/tproxy-mark-hex", "-t 0x539")
            .expect(refuses("--istio-inbound-tproxy-mark")),
        on_tproxy("kept/route-table-name", "-r main")
            .expect(refuses("--istio-inbound-tproxy-route-table")),
        on_injector("kept/bool-env-word", "")
            .env("REDIRECT_DNS", "yes")
            .expect(refuses("env REDIRECT_DNS")),
        on_injector("kept/probe-port-env", "")
            .env("IPTABLES_PROBE_PORT", "abc")
            .expect(refuses("env IPTABLES_PROBE_PORT")),
        on_injector("kept/probe-timeout-env", "")
            .env("PROBE_TIMEOUT", "soon")
            .expect(refuses("env PROBE_TIMEOUT")),
        on_injector("kept/owner-group-odd-name", "")
            .env(GROUPS, "a+b")
            .expect(refuses("env ISTIO_OUTBOUND_OWNER_GROUPS")),
        on_injector("kept/owner-groups-exclude-65", "")
            .env(GROUPS_EXCLUDE, groups65)
            .expect(refuses("env ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE")),
        on_injector(
            "kept/network-namespace-missing",
            "--network-namespace=/nonexistent",
        )
        .expect(refuses("/nonexistent")),
        on_injector("kept/cni-mode", "--cni-mode").expect(OursRefuses {
            code: 255,
            names: "--cni-mode",
        }),
        on_injector("kept/positional-word", "extra").expect(OursRefuses {
            code: 255,
            names: "extra",
        }),
        // Kept: Istio refuses what has one plain meaning, which ours applies.
        on_injector("kept/bare-address-include", "-i 10.0.0.1")
            .expect(IstioRefuses(&[Arg("10.0.0.1", "10.0.0.1/32")])),
        on_injector("kept/bare-address-include-v6", "-i fd00::1")
            .net(Addrs::V6)
            .expect(IstioRefuses(&[Arg("fd00::1", "fd00::1/128")])),
        on_injector("kept/bare-address-exclude", "-x 169.254.169.254").expect(IstioRefuses(&[
            Arg("169.254.169.254", "169.254.169.254/32"),
        ])),
        on_injector(
            "kept/spaces-in-cidr-list",
            "-i '10.0.0.0/8, 192.168.0.0/16'",
        )
        .expect(IstioRefuses(&[Arg(
            "10.0.0.0/8, 192.168.0.0/16",
            "10.0.0.0/8,192.168.0.0/16",
        )])),
        on_injector("kept/prefix-leading-zero", "-i 10.0.0.0/08")
            .expect(IstioRefuses(&[Arg("10.0.0.0/08", "10.0.0.0/8")])),
        on_injector("kept/loopback-cidr-bare", "")
            .env(LOOPBACK_CIDR, "127.0.0.1")
            .expect(IstioRefuses(&[Env(LOOPBACK_CIDR, "127.0.0.1/32")])),
        on_injector("kept/no-address", "")
            .net(Addrs::LoOnly)
            .expect(IstioRefuses(&[Edit::Addrs(Addrs::V4)])),
        // Kept: both apply, ours reads the input otherwise.
        on_injector("kept/dual-pod-no-dual-stack", "")
            .net(Addrs::Dual)
            .expect(ReadsAs(&[Push("--dual-stack")])),
        on_injector("kept/dual-pod-dual-stack-false", "--dual-stack=false")
            .net(Addrs::Dual)
            .expect(ReadsAs(&[Push("--dual-stack")])),
        vm("kept/dual-host-vm")
            .net(Addrs::Dual)
            .expect(ReadsAs(&[Push("--dual-stack")])),
        on_injector("kept/bool-flag-then-word", "--redirect-dns false")
            .expect(ReadsAs(&[DropArg("--redirect-dns"), DropArg("false")])),
        on_injector("kept/owner-groups-empty", "")
            .env(GROUPS, "")
            .expect(ReadsAs(&[Unenv(GROUPS)])),
        on_tproxy("kept/tproxy-mark-leading-zero", "-t 01337")
            .expect(ReadsAs(&[Arg("01337", "1337")])),
        on_injector("kept/nameserver-zone", "--redirect-dns")
            .net(Addrs::V6)
            .resolv(Resolv::Zoned)
            .expect(ReadsAs(&[Edit::Resolv(Resolv::LinkLocal)])),
        case("kept/inbound-ports-blank", "-i '*' -b ' '").expect(ReadsAs(&[Arg(" ", "")])),
        on_injector("kept/uid-blank", "-u ' '").expect(ReadsAs(&[Arg(" ", "1337")])),
    ]
}

fn matrix() -> Vec<Case> {
    let mut cases = curated();
    cases.extend(generated("pairwise", &pairwise_dims(), 2));
    cases.extend(generated("core", &core_dims(), 3));
    cases.extend(probes());
    cases
}

// ---------------------------------------------------------------------------------------------
// Runs and their rule sets

/// One table of one family as iptables-restore sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct TableRules {
    chains: BTreeSet<String>,
    rules: Vec<String>,
}

/// Family ("v4"/"v6") → table → rules.
type RuleSets = BTreeMap<&'static str, BTreeMap<String, TableRules>>;

#[derive(Clone, Debug)]
struct Run {
    code: i32,
    rules: RuleSets,
    /// The tail of the tool's output, for failure messages.
    said: String,
}

impl Run {
    fn same(&self, other: &Run) -> bool {
        self.code == other.code && self.rules == other.rules
    }

    fn summary(&self) -> String {
        let fams: Vec<String> = self
            .rules
            .iter()
            .map(|(f, t)| format!("{f} [{}]", t.keys().cloned().collect::<Vec<_>>().join(",")))
            .collect();
        format!("exit {}, {}", self.code, fams.join(" "))
    }
}

/// Parses restore payloads. `family_at` says, for a `* table` line, whether it starts a new
/// family block (Istio writes the two blocks back to back, ours under headers).
#[derive(Default)]
struct RestoreParser {
    families: Vec<BTreeMap<String, TableRules>>,
    table: Option<(String, TableRules)>,
}

impl RestoreParser {
    fn line(&mut self, line: &str) -> Result<(), String> {
        if let Some(name) = line.strip_prefix("* ") {
            if self.table.is_some() {
                return Err(format!("table {name} opened inside another"));
            }
            self.table = Some((name.to_string(), TableRules::default()));
            return Ok(());
        }
        let Some((name, table)) = self.table.as_mut() else {
            return Err(format!("{line:?} outside a table"));
        };
        if let Some(chain) = line.strip_prefix("-N ") {
            table.chains.insert(chain.to_string());
        } else if line.starts_with("-A ") || line.starts_with("-I ") {
            table.rules.push(line.to_string());
        } else if line == "COMMIT" {
            let family = self
                .families
                .last_mut()
                .ok_or("a table before any family")?;
            if family.contains_key(name.as_str()) {
                return Err(format!("table {name} twice in one family"));
            }
            let (name, table) = self.table.take().unwrap();
            family.insert(name, table);
        } else {
            return Err(format!("unexpected line {line:?}"));
        }
        Ok(())
    }

    fn finish(self) -> Result<RuleSets, String> {
        if let Some((name, _)) = self.table {
            return Err(format!("table {name} without COMMIT"));
        }
        if self.families.len() > 2 {
            return Err(format!("{} families", self.families.len()));
        }
        Ok(["v4", "v6"].into_iter().zip(self.families).collect())
    }
}

fn collapse(line: &str) -> String {
    line.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Istio's DRY_RUN_FILE_PATH: `iptables-save`/`ip6tables-save` commands, the v4 restore input,
/// the v6 one when IPv6 is on (a second `ip6tables-save` line says so), back to back with their
/// tables sorted, so the v6 block starts at a table not after the one before it.
fn parse_istio(text: &str, code: i32) -> Result<RuleSets, String> {
    let mut p = RestoreParser::default();
    let mut v6_saves = 0;
    let mut last_table: Option<String> = None;
    for raw in text.lines() {
        let line = collapse(raw);
        match line.as_str() {
            "" | "iptables-save" => {}
            "ip6tables-save" => v6_saves += 1,
            l => {
                if let Some(name) = l.strip_prefix("* ") {
                    if last_table.as_deref().is_none_or(|prev| name <= prev) {
                        p.families.push(BTreeMap::new());
                    }
                    last_table = Some(name.to_string());
                }
                p.line(l)?;
            }
        }
    }
    let rules = p.finish()?;
    if code == 0 && rules.contains_key("v6") != (v6_saves == 2) {
        return Err(format!(
            "{v6_saves} ip6tables-save lines but families {:?}",
            rules.keys().collect::<Vec<_>>()
        ));
    }
    Ok(rules)
}

/// Ours: `# V4 (iptables-restore --noflush)` then the payload, `# V6 ...` then its payload.
fn parse_ours(text: &str) -> Result<RuleSets, String> {
    let mut p = RestoreParser::default();
    for raw in text.lines() {
        let line = collapse(raw);
        if line.is_empty() {
            continue;
        }
        if line.starts_with("# V4 ") || line.starts_with("# V6 ") {
            let want = if line.starts_with("# V4 ") { 0 } else { 1 };
            if p.families.len() != want {
                return Err(format!("{line:?} out of order"));
            }
            p.families.push(BTreeMap::new());
            continue;
        }
        p.line(&line)?;
    }
    p.finish()
}

fn tail(bytes: &[u8], lines: usize) -> String {
    harness::tail(&String::from_utf8_lossy(bytes), lines)
}

/// The two tools and the namespaces they run in.
struct Bench {
    istio: PathBuf,
    ours: PathBuf,
    dir: PathBuf,
    netns: HashMap<(Addrs, Resolv), String>,
    runs: AtomicUsize,
    /// `--native-nftables`: both tools apply for real, each in a namespace of its own.
    nft: bool,
}

impl Bench {
    /// A `--native-nftables` run: Istio's nftables path ignores `--dry-run` and programs the
    /// namespace, so each run gets a fresh namespace; the rule set is what the kernel then holds
    /// (`nft --json list ruleset`, the policy routing the TPROXY mode adds), removed afterwards.
    fn nft_run(&self, case: &Case, istio: bool) -> Run {
        let case = &nft_case(case, istio);
        let n = self.runs.fetch_add(1, Ordering::Relaxed);
        let ns = format!("{PREFIX}-{}-nft{n}", std::process::id());
        make_netns(&ns, case.addrs, case.resolv);
        let before = routing(&ns);
        let mut cmd = Command::new("ip");
        cmd.env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .envs(case.env.iter().map(|(n, v)| (n, v)))
            .args(["netns", "exec", &ns]);
        if istio {
            cmd.arg(&self.istio).arg("istio-iptables");
        } else {
            cmd.arg(&self.ours);
        }
        // First: a case may end in a flag without its value.
        let out = cmd
            .arg("--native-nftables")
            .args(&case.argv)
            .output()
            .unwrap();
        let rules = kernel_nft_rules(&ns, &before);
        remove_netns(&ns);
        // nft's errors come with the rule and a caret line: more lines than a dry run's.
        let mut said = tail(&out.stdout, 12);
        said.push('\n');
        said.push_str(&tail(&out.stderr, 12));
        Run {
            code: out.status.code().unwrap_or(-1),
            rules,
            said,
        }
    }

    fn command(&self, case: &Case) -> Command {
        let ns = &self.netns[&(case.addrs, case.resolv)];
        let mut cmd = Command::new("ip");
        cmd.env_clear()
            .envs(case.env.iter().map(|(n, v)| (n, v)))
            .args(["netns", "exec", ns]);
        cmd
    }

    fn istio(&self, case: &Case) -> Run {
        if self.nft {
            return self.nft_run(case, true);
        }
        let n = self.runs.fetch_add(1, Ordering::Relaxed);
        let file = self.dir.join(format!("istio-{n}.txt"));
        let out = self
            .command(case)
            .env("DRY_RUN_FILE_PATH", &file)
            .arg(&self.istio)
            .args(["istio-iptables", "--dry-run"])
            .args(&case.argv)
            .output()
            .unwrap();
        let code = out.status.code().unwrap_or(-1);
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        let _ = std::fs::remove_file(&file);
        let rules = parse_istio(&text, code)
            .unwrap_or_else(|e| panic!("{}\nIstio's dry-run file: {e}\n{text}", case.describe()));
        let mut said = tail(&out.stdout, 3);
        said.push('\n');
        said.push_str(&tail(&out.stderr, 3));
        Run { code, rules, said }
    }

    fn ours(&self, case: &Case) -> Run {
        if self.nft {
            return self.nft_run(case, false);
        }
        let out = self
            .command(case)
            .arg(&self.ours)
            .arg("--dry-run")
            .args(&case.argv)
            .output()
            .unwrap();
        let code = out.status.code().unwrap_or(-1);
        let text = String::from_utf8_lossy(&out.stdout);
        let rules = parse_ours(&text)
            .unwrap_or_else(|e| panic!("{}\nour --dry-run output: {e}\n{text}", case.describe()));
        Run {
            code,
            rules,
            said: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// Runs a case and judges it: `Ok` with its kind, or `Err` with a report.
    fn judge(&self, case: &Case) -> Result<&'static str, String> {
        let istio = self.istio(case);
        let ours = self.ours(case);
        let fail = |why: String, extra: String| {
            Err(format!(
                "{}\n    {why}\n    Istio: {}\n    ours:  {}\n    ours said: {}\n    Istio said: {}\n{extra}",
                case.describe(),
                istio.summary(),
                ours.summary(),
                tail(ours.said.as_bytes(), 3).replace('\n', "\n      "),
                istio.said.trim().replace('\n', "\n      "),
            ))
        };
        // Istio's nftables mode fails where its iptables mode applies, when its transaction
        // jumps to a chain it did not create (DNS capture whose servers are all of a family
        // the pod has no rules for): nft refuses the whole transaction. Ours applies.
        let missing_chain = "Could not process rule: No such file or directory";
        if self.nft && istio.code == 1 && istio.said.contains(missing_chain) {
            return match (case.expect, ours.code, ours.rules.contains_key("inet")) {
                (Expect::Same, 0, true) => {
                    Ok("kept: Istio's nftables transaction jumps to a chain it lacks, ours applies")
                }
                _ => fail(
                    "Istio's nft refused a jump to a missing chain; ours should apply".into(),
                    String::new(),
                ),
            };
        }
        match case.expect {
            Expect::Same if istio.code != 0 => fail(
                "Istio refuses this case (an expected refusal is `Codes`)".into(),
                String::new(),
            ),
            Expect::Same if istio.same(&ours) => Ok(case.expect.kind()),
            Expect::Same => fail(
                "differs from Istio (fix ours, or give the case its kept difference)".into(),
                diff(&istio, &ours, "Istio", "ours"),
            ),
            Expect::OursRefuses { code, names } => {
                // Istio's nftables mode writes the input into its transaction, and nft rejects
                // what ours refuses up front: accepted as Istio's nft refusing it.
                let nft_refuses = self.nft
                    && istio.code == 1
                    && [
                        "nftables run failed",
                        "failed to configure routes",
                        "Group does not exist",
                    ]
                    .iter()
                    .any(|said| istio.said.contains(said));
                if (istio.code != 0 || istio.rules.is_empty()) && !nft_refuses {
                    return fail("Istio no longer applies this".into(), String::new());
                }
                if ours.code != code || !ours.rules.is_empty() || !ours.said.contains(names) {
                    return fail(
                        format!("ours should refuse with exit {code}, naming {names:?}"),
                        String::new(),
                    );
                }
                Ok(if nft_refuses {
                    "kept: ours refuses, Istio's nftables mode fails on it (its rules applied or not)"
                } else {
                    case.expect.kind()
                })
            }
            Expect::IstioRefuses(edits) => {
                let as_read = self.istio(&case.edited(edits));
                if istio.code != 1 || !istio.rules.is_empty() {
                    return fail("Istio no longer refuses this".into(), String::new());
                }
                if as_read.code != 0 || !ours.same(&as_read) {
                    return fail(
                        format!("ours should apply it as Istio applies {edits:?}"),
                        diff(&as_read, &ours, "Istio, edited", "ours"),
                    );
                }
                Ok(case.expect.kind())
            }
            Expect::ReadsAs(edits) => {
                if istio.same(&ours) {
                    return fail(
                        "no difference any more: drop its kept difference".into(),
                        String::new(),
                    );
                }
                let as_read = self.istio(&case.edited(edits));
                if as_read.code != 0 || !ours.same(&as_read) {
                    return fail(
                        format!("ours should apply it as Istio applies {edits:?}"),
                        diff(&as_read, &ours, "Istio, edited", "ours"),
                    );
                }
                Ok(case.expect.kind())
            }
            Expect::Codes { istio: i, ours: o } => {
                if istio.code != i || ours.code != o || !ours.rules.is_empty() {
                    return fail(
                        format!("expected Istio to exit {i} and ours {o}, without rules"),
                        String::new(),
                    );
                }
                Ok(case.expect.kind())
            }
        }
    }
}

/// What differs between two runs: families, chains, and a line diff of each table's rules.
fn diff(a: &Run, b: &Run, an: &str, bn: &str) -> String {
    let mut out = String::new();
    if a.code != b.code {
        let _ = writeln!(out, "    exit: {an} {}, {bn} {}", a.code, b.code);
    }
    let families: BTreeSet<&&str> = a.rules.keys().chain(b.rules.keys()).collect();
    let empty = BTreeMap::new();
    for fam in families {
        let (ta, tb) = (
            a.rules.get(*fam).unwrap_or(&empty),
            b.rules.get(*fam).unwrap_or(&empty),
        );
        if !a.rules.contains_key(*fam) || !b.rules.contains_key(*fam) {
            let who = if a.rules.contains_key(*fam) { an } else { bn };
            let _ = writeln!(out, "    {fam}: only {who} writes this family");
        }
        let tables: BTreeSet<&String> = ta.keys().chain(tb.keys()).collect();
        let none = TableRules::default();
        for t in tables {
            let (x, y) = (ta.get(t).unwrap_or(&none), tb.get(t).unwrap_or(&none));
            if x == y {
                continue;
            }
            let _ = writeln!(out, "    {fam} {t} (- {an} only, + {bn} only):");
            for c in x.chains.difference(&y.chains) {
                let _ = writeln!(out, "      - -N {c}");
            }
            for c in y.chains.difference(&x.chains) {
                let _ = writeln!(out, "      + -N {c}");
            }
            for line in line_diff(&x.rules, &y.rules) {
                let _ = writeln!(out, "      {line}");
            }
        }
    }
    out
}

/// A longest-common-subsequence diff: `  same`, `- a only`, `+ b only`.
fn line_diff(a: &[String], b: &[String]) -> Vec<String> {
    let mut lcs = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            lcs[i][j] = if a[i] == b[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    let (mut i, mut j, mut out) = (0, 0, Vec::new());
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            out.push(format!("  {}", a[i]));
            i += 1;
            j += 1;
        } else if j < b.len() && (i == a.len() || lcs[i][j + 1] >= lcs[i + 1][j]) {
            out.push(format!("+ {}", b[j]));
            j += 1;
        } else {
            out.push(format!("- {}", a[i]));
            i += 1;
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Namespaces

/// The network namespaces of a run, one per (addresses, resolv.conf) the cases use; removed on
/// drop. They have an address on a bridge with no ports and no route to anything.
struct Namespaces {
    names: Vec<String>,
    /// Istio's dry-run files.
    dir: PathBuf,
}

impl Namespaces {
    fn create(keys: &BTreeSet<(Addrs, Resolv)>) -> (Namespaces, HashMap<(Addrs, Resolv), String>) {
        let dir = std::env::temp_dir().join(format!("{PREFIX}-{}-oracle", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut made = Namespaces {
            names: Vec::new(),
            dir,
        };
        let mut map = HashMap::new();
        for (i, &(addrs, resolv)) in keys.iter().enumerate() {
            let ns = format!("{PREFIX}-{}-oracle{i}", std::process::id());
            made.names.push(ns.clone());
            make_netns(&ns, addrs, resolv);
            map.insert((addrs, resolv), ns);
        }
        (made, map)
    }
}

/// A case as the nftables oracle runs it. Istio's nftables mode writes list items into the
/// transaction as the iptables mode passes them to iptables, and `nft` refuses two of
/// iptables' spellings: a port range `a:b` (nft's is `a-b`) and an interface wildcard `eth+`
/// (nft's `eth*`); Istio is given nft's spelling of the same input, ours the case as it is
/// (it writes nft's spelling itself). Both tools pass owner group names to `nft`, which
/// resolves them on the host: the matrix's `java` (no such group here) becomes `root`.
fn nft_case(case: &Case, istio: bool) -> Case {
    let mut c = case.clone();
    if istio {
        // A `:` between digits is a range, outside CIDRs (IPv6 ones have digits around `:`).
        let respell = |v: &str| {
            let chars: Vec<char> = v.chars().collect();
            let mut out = String::new();
            for (i, ch) in chars.iter().enumerate() {
                let digit = |j: Option<usize>| {
                    j.and_then(|j| chars.get(j))
                        .is_some_and(char::is_ascii_digit)
                };
                let range =
                    *ch == ':' && !v.contains('/') && digit(i.checked_sub(1)) && digit(Some(i + 1));
                out.push(if range { '-' } else { *ch });
            }
            let out = out.replace("+,", "*,");
            match out.strip_suffix('+') {
                Some(head) => format!("{head}*"),
                None => out,
            }
        };
        for word in &mut c.argv {
            *word = respell(word);
        }
        for (_, value) in &mut c.env {
            *value = respell(value);
        }
    }
    for (name, value) in &mut c.env {
        if name == GROUPS || name == GROUPS_EXCLUDE {
            *value = value.replace("java", "root");
        }
    }
    c
}

/// A namespace with `addrs` on a bridge with no ports and no route to anything, and `resolv`
/// as its /etc/resolv.conf.
fn make_netns(ns: &str, addrs: Addrs, resolv: Resolv) {
    run("ip", &["netns", "add", ns]).unwrap();
    run("ip", &["-n", ns, "link", "set", "lo", "up"]).unwrap();
    if !addrs.cidrs().is_empty() {
        run("ip", &["-n", ns, "link", "add", "pod0", "type", "bridge"]).unwrap();
        run("ip", &["-n", ns, "link", "set", "pod0", "up"]).unwrap();
    }
    for cidr in addrs.cidrs() {
        run(
            "ip",
            &["-n", ns, "addr", "add", cidr, "dev", "pod0", "nodad"],
        )
        .unwrap();
    }
    // The kernel adds an IPv6 address's local route a moment after the address: wait for every
    // one, so a run's routing snapshot never sees it appear (the nftables oracle compares what
    // a run added).
    for cidr in addrs.cidrs() {
        let local = format!("local {} ", cidr.split('/').next().unwrap_or_default());
        let present = || {
            ["-4", "-6"].iter().any(|fam| {
                Command::new("ip")
                    .args(["-n", ns, fam, "route", "show", "table", "local"])
                    .output()
                    .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains(&local))
            })
        };
        assert!(
            harness::wait_until(std::time::Duration::from_secs(5), present),
            "{ns}: no local route for {cidr}"
        );
    }
    // `ip netns exec` mounts /etc/netns/NS/resolv.conf over /etc/resolv.conf.
    let etc = Path::new("/etc/netns").join(ns);
    std::fs::create_dir_all(&etc).unwrap();
    std::fs::write(etc.join("resolv.conf"), resolv.text()).unwrap();
}

fn remove_netns(ns: &str) {
    let _ = std::fs::remove_dir_all(Path::new("/etc/netns").join(ns));
    let _ = Command::new("ip").args(["netns", "delete", ns]).status();
}

/// What the kernel of `ns` holds after an nftables run, in the shape the comparison takes:
/// family "inet", per table the chains (name, type, hook, priority, policy) and the rules
/// (chain, then each statement as nft's JSON, counters without their numbers, and each run of
/// matches sorted: a rule's matches are one conjunction, their order does not change what it
/// does); and, as family "routing", the policy rules, routes and loopback addresses of both
/// IP families (the TPROXY mode's `fwmark` rule and local route, the `::6` address) that
/// differ from `before` (what the namespace had before the run).
fn kernel_nft_rules(ns: &str, before: &[String]) -> RuleSets {
    let out = Command::new("ip")
        .args(["netns", "exec", ns, "nft", "--json", "list", "ruleset"])
        .output()
        .unwrap();
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "nft --json list ruleset in {ns}: {e}: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let mut tables: BTreeMap<String, TableRules> = BTreeMap::new();
    for item in json["nftables"].as_array().into_iter().flatten() {
        if let Some(chain) = item.get("chain") {
            let decl = ["name", "type", "hook", "prio", "policy"]
                .iter()
                .filter_map(|k| chain.get(*k).map(|v| format!("{k}={v}")))
                .collect::<Vec<_>>()
                .join(" ");
            tables
                .entry(chain["table"].as_str().unwrap_or_default().to_string())
                .or_default()
                .chains
                .insert(decl);
        }
        if let Some(rule) = item.get("rule") {
            let mut words: Vec<String> = Vec::new();
            let mut matches: Vec<String> = Vec::new();
            for stmt in rule["expr"].as_array().into_iter().flatten() {
                if stmt.get("match").is_some() {
                    matches.push(stmt.to_string());
                    continue;
                }
                matches.sort();
                words.append(&mut matches);
                words.push(if stmt.get("counter").is_some() {
                    "counter".to_string()
                } else {
                    stmt.to_string()
                });
            }
            matches.sort();
            words.append(&mut matches);
            tables
                .entry(rule["table"].as_str().unwrap_or_default().to_string())
                .or_default()
                .rules
                .push(format!(
                    "{}: {}",
                    rule["chain"].as_str().unwrap_or_default(),
                    words.join(" ; ")
                ));
        }
    }
    let after = routing(ns);
    let mut changed = TableRules::default();
    changed.rules.extend(
        after
            .iter()
            .filter(|l| !before.contains(l))
            .map(|l| format!("+ {l}")),
    );
    changed.rules.extend(
        before
            .iter()
            .filter(|l| !after.contains(l))
            .map(|l| format!("- {l}")),
    );
    let mut sets = RuleSets::new();
    if !tables.is_empty() {
        sets.insert("inet", tables);
    }
    if !changed.rules.is_empty() {
        sets.insert("routing", BTreeMap::from([("ip".to_string(), changed)]));
    }
    sets
}

/// The policy rules, routes and loopback addresses of both IP families in `ns`.
fn routing(ns: &str) -> Vec<String> {
    let mut lines = Vec::new();
    for args in [
        &["rule", "show"][..],
        &["-6", "rule", "show"],
        &["route", "show", "table", "all"],
        &["-6", "route", "show", "table", "all"],
        &["-6", "addr", "show", "dev", "lo"],
    ] {
        let out = Command::new("ip")
            .arg("-n")
            .arg(ns)
            .args(args)
            .output()
            .unwrap();
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            // Address lifetimes are timing, not configuration.
            if !line.trim_start().starts_with("valid_lft") {
                lines.push(format!("{}: {}", args.join(" "), collapse(line)));
            }
        }
    }
    lines
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        for ns in &self.names {
            remove_netns(ns);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Our binary, refused when older than the crate's sources (`-p e2e-tests` does not rebuild it).
fn our_binary() -> PathBuf {
    let bin = binary("istio-iptables");
    let built = std::fs::metadata(&bin)
        .and_then(|m| m.modified())
        .unwrap_or_else(|_| panic!("{} is missing: cargo build -p istio-init", bin.display()));
    if std::env::var_os("E2E_BIN_DIR").is_none() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../init/src");
        let newest = std::fs::read_dir(&src)
            .unwrap()
            .filter_map(|e| e.ok()?.metadata().ok()?.modified().ok())
            .max()
            .unwrap_or(SystemTime::UNIX_EPOCH);
        assert!(
            built >= newest,
            "{} is older than init/src: cargo build -p istio-init first",
            bin.display()
        );
    }
    bin
}

#[test]
fn ours_matches_istio_or_differs_as_kept() {
    oracle(false);
}

/// The same matrix with `--native-nftables` (Istio 1.27+), both tools applying for real.
#[test]
fn nftables_ours_matches_istio_or_differs_as_kept() {
    oracle(true);
}

fn oracle(nft: bool) {
    if !nix::unistd::geteuid().is_root() {
        cannot_run("rules_oracle: needs root (network namespaces)");
        return;
    }
    let Ok(istio) = istio_bin("pilot-agent") else {
        return;
    };
    let ours = our_binary();
    let started = Instant::now();
    let cases = matrix();
    let names: BTreeSet<&str> = cases.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names.len(), cases.len(), "case names repeat");

    sweep_stale();
    let mut keys: BTreeSet<(Addrs, Resolv)> = cases.iter().map(|c| (c.addrs, c.resolv)).collect();
    for c in &cases {
        for edit in match c.expect {
            Expect::IstioRefuses(e) | Expect::ReadsAs(e) => e,
            _ => &[],
        } {
            let e = c.edited(std::slice::from_ref(edit));
            keys.insert((e.addrs, e.resolv));
        }
    }
    // The nftables runs make a namespace each (`Bench::nft_run`): no shared ones.
    if nft {
        keys.clear();
    }
    let (namespaces, netns) = Namespaces::create(&keys);
    let bench = Bench {
        istio,
        ours,
        dir: namespaces.dir.clone(),
        netns,
        runs: AtomicUsize::new(0),
        nft,
    };

    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<(usize, Result<&'static str, String>)>> = Mutex::new(Vec::new());
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get() * 2);
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(case) = cases.get(i) else { break };
                    let verdict = bench.judge(case);
                    results.lock().unwrap().push((i, verdict));
                }
            });
        }
    });
    drop(namespaces);

    let mut results = results.into_inner().unwrap();
    results.sort_by_key(|(i, _)| *i);
    let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
    let mut failures = Vec::new();
    for (_, r) in results {
        match r {
            Ok(kind) => *kinds.entry(kind).or_default() += 1,
            Err(report) => failures.push(report),
        }
    }
    let tiers: BTreeMap<&str, usize> = cases.iter().fold(BTreeMap::new(), |mut m, c| {
        *m.entry(c.name.split('/').next().unwrap()).or_default() += 1;
        m
    });
    eprintln!(
        "rules_oracle{}: {} cases {tiers:?}, {} namespaces, {} Istio runs, {:.1}s: {kinds:?}",
        if nft { " (nftables)" } else { "" },
        cases.len(),
        keys.len(),
        bench.runs.load(Ordering::Relaxed),
        started.elapsed().as_secs_f64()
    );
    assert!(
        failures.is_empty(),
        "{} of {} cases fail:\n\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n\n")
    );
}
