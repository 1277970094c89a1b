#![allow(clippy::unwrap_used)] // test code: a panic is the failure report
//! Real traffic through istio-iptables rules, IPv4 and IPv6: what must reach Envoy's ports does,
//! with the true original destination; what must bypass does; DNS lands on the agent's port;
//! reconciling lets no connection escape; inbound to every port but the excluded ones lands on
//! 15006; validation passes with rules and exits 126 without, within its probe timeout.

use std::time::Duration;

use harness::INJECTOR_INIT_ARGS as DEFAULT_ARGS;
use harness::{Network, Pod, binary, require_root};

const APP: u32 = 1000;
const PROXY: u32 = 1337;
const WAIT: Duration = Duration::from_secs(10);

fn netprobe() -> String {
    binary("netprobe").to_str().unwrap().to_string()
}

fn init(pod: &Pod, extra: &[&str]) {
    let mut args = DEFAULT_ARGS.to_vec();
    args.extend(extra);
    init_with(pod, &args);
}

/// Runs istio-iptables with exactly `args`, and fails unless it succeeds.
fn init_with(pod: &Pod, args: &[&str]) {
    let bin = binary("istio-iptables");
    let mut full = vec![bin.to_str().unwrap()];
    full.extend(args);
    let out = pod.exec(&full).unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn connect(pod: &Pod, uid: u32, addr: &str) -> bool {
    let np = netprobe();
    pod.exec_as(uid, uid, &[&np, "connect", addr])
        .unwrap()
        .status
        .success()
}

fn two_pods() -> Network {
    let mut net = Network::new().unwrap();
    net.add_pod("a", 2).unwrap();
    net.add_pod("b", 3).unwrap();
    net
}

#[test]
fn outbound_and_inbound_capture_v4_and_v6() {
    outbound_and_inbound_capture_v4_and_v6_with(&[]);
}

/// The same with `--native-nftables` (Istio's nftables tables instead of iptables rules).
#[test]
fn outbound_and_inbound_capture_v4_and_v6_nftables() {
    outbound_and_inbound_capture_v4_and_v6_with(&["--native-nftables"]);
}

fn outbound_and_inbound_capture_v4_and_v6_with(mode: &[&str]) {
    if !require_root("outbound_and_inbound_capture_v4_and_v6") {
        return;
    }
    let mut net = two_pods();
    init(&net.pods[0], mode);
    let np = netprobe();
    // Envoy's stand-in in pod a, and the plain servers in pod b.
    net.pods[0]
        .spawn(
            "recorder",
            PROXY,
            PROXY,
            &[],
            &[&np, "listen", "15001,15006,15020"],
        )
        .unwrap();
    net.pods[1]
        .spawn("server", 0, 0, &[], &[&np, "listen", "9000,8080"])
        .unwrap();
    assert!(net.pods[0].wait_log("recorder", "listening", WAIT));
    assert!(net.pods[1].wait_log("server", "listening", WAIT));
    let (a, b) = (&net.pods[0], &net.pods[1]);

    // Outbound from the app (and from root) lands on 15001 with the true original destination.
    for (uid, dst) in [
        (APP, "10.233.0.3:9000"),
        (0, "10.233.0.3:8080"),
        (APP, "[fd00:233::3]:9000"),
    ] {
        assert!(
            connect(a, uid, dst),
            "uid {uid} -> {dst} failed\n{}",
            net.logs()
        );
        let line = format!("accept port=15001 orig={dst}");
        assert!(
            a.wait_log("recorder", &line, WAIT),
            "missing `{line}`\n{}",
            net.logs()
        );
    }
    assert!(
        !b.logs_of("server").contains("accept"),
        "a captured connection reached b directly"
    );

    // The proxy's uid goes direct, and so does any uid in the proxy's group.
    for dst in ["10.233.0.3:9000", "[fd00:233::3]:9000"] {
        assert!(connect(a, PROXY, dst));
        assert!(
            b.wait_log("server", &format!("local={dst}"), WAIT),
            "{}",
            net.logs()
        );
    }
    let out = a
        .exec_as(APP, PROXY, &[&np, "connect", "10.233.0.3:8080"])
        .unwrap();
    assert!(out.status.success());
    assert!(
        b.wait_log("server", "local=10.233.0.3:8080", WAIT),
        "{}",
        net.logs()
    );

    // Inbound lands on 15006 with the original port, except the excluded ports.
    for dst in ["10.233.0.2:8080", "[fd00:233::2]:8080"] {
        assert!(connect(b, APP, dst), "{}", net.logs());
        let line = format!("accept port=15006 orig={dst}");
        assert!(
            a.wait_log("recorder", &line, WAIT),
            "missing `{line}`\n{}",
            net.logs()
        );
    }
    for dst in ["10.233.0.2:15020", "[fd00:233::2]:15020"] {
        assert!(connect(b, APP, dst));
        let line = format!("accept port=15020 orig={dst}");
        assert!(
            a.wait_log("recorder", &line, WAIT),
            "missing `{line}`\n{}",
            net.logs()
        );
    }
    assert!(
        !a.logs_of("recorder")
            .contains("port=15006 orig=10.233.0.2:15020")
    );
}

#[test]
fn dns_to_the_resolv_conf_server_lands_on_15053() {
    dns_to_the_resolv_conf_server_lands_on_15053_with(&[]);
}

/// The same with `--native-nftables` (Istio's nftables tables instead of iptables rules).
#[test]
fn dns_to_the_resolv_conf_server_lands_on_15053_nftables() {
    dns_to_the_resolv_conf_server_lands_on_15053_with(&["--native-nftables"]);
}

fn dns_to_the_resolv_conf_server_lands_on_15053_with(mode: &[&str]) {
    if !require_root("dns_to_the_resolv_conf_server_lands_on_15053") {
        return;
    }
    let mut net = two_pods();
    net.pods[0]
        .set_resolv_conf("nameserver 10.233.0.3\n")
        .unwrap();
    let mut extra = vec!["--redirect-dns"];
    extra.extend(mode);
    init(&net.pods[0], &extra);
    let np = netprobe();
    net.pods[0]
        .spawn("dns", PROXY, PROXY, &[], &[&np, "udp-echo", "15053"])
        .unwrap();
    net.pods[1]
        .spawn("upstream", 0, 0, &[], &[&np, "udp-echo", "53"])
        .unwrap();
    assert!(net.pods[0].wait_log("dns", "listening", WAIT));
    assert!(net.pods[1].wait_log("upstream", "listening", WAIT));
    let a = &net.pods[0];
    let out = a.exec_as(APP, APP, &[&np, "udp", "10.233.0.3:53"]).unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "echo 15053",
        "{}",
        net.logs()
    );
    // The agent (proxy uid) reaches the real upstream.
    let out = a
        .exec_as(PROXY, PROXY, &[&np, "udp", "10.233.0.3:53"])
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "echo 53",
        "{}",
        net.logs()
    );
}

#[test]
fn reconcile_lets_no_connection_escape() {
    reconcile_lets_no_connection_escape_with(&[]);
}

/// The same with `--native-nftables` (Istio's nftables tables instead of iptables rules).
#[test]
fn reconcile_lets_no_connection_escape_nftables() {
    reconcile_lets_no_connection_escape_with(&["--native-nftables"]);
}

fn reconcile_lets_no_connection_escape_with(mode: &[&str]) {
    if !require_root("reconcile_lets_no_connection_escape") {
        return;
    }
    let mut net = two_pods();
    init(&net.pods[0], mode);
    let np = netprobe();
    net.pods[0]
        .spawn("recorder", PROXY, PROXY, &[], &[&np, "listen", "15001"])
        .unwrap();
    net.pods[1]
        .spawn("server", 0, 0, &[], &[&np, "listen", "9000"])
        .unwrap();
    assert!(net.pods[0].wait_log("recorder", "listening", WAIT));
    assert!(net.pods[1].wait_log("server", "listening", WAIT));

    let ns = net.pods[0].ns.clone();
    let np2 = np.clone();
    let load = std::thread::spawn(move || {
        std::process::Command::new("ip")
            .args([
                "netns", "exec", &ns, "setpriv", "--reuid", "1000", "--regid", "1000",
            ])
            .args([
                "--clear-groups",
                "--",
                &np2,
                "connect",
                "10.233.0.3:9000",
                "20000",
            ])
            .output()
            .unwrap()
    });
    let bin = binary("istio-iptables");
    let mut switches = 0;
    while !load.is_finished() && switches < 30 {
        let excludes = if switches % 2 == 0 {
            "15090"
        } else {
            "15090,15021,15020"
        };
        let mut args = vec![bin.to_str().unwrap()];
        args.extend(&DEFAULT_ARGS[..15]);
        args.extend([excludes, "--reconcile"]);
        args.extend(mode);
        let out = net.pods[0].exec(&args).unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        switches += 1;
    }
    let out = load.join().unwrap();
    let report = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "connect loop: {report}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        switches >= 10,
        "the connect loop ended after only {switches} reconciles"
    );
    assert!(
        !net.pods[1].logs_of("server").contains("accept"),
        "a connection escaped capture during reconcile ({switches} switches)\n{}",
        net.logs()
    );
}

#[test]
fn validation_passes_with_rules_and_exits_126_without() {
    validation_passes_with_rules_and_exits_126_without_with(&[]);
}

/// The same with `--native-nftables` (Istio's nftables tables instead of iptables rules).
#[test]
fn validation_passes_with_rules_and_exits_126_without_nftables() {
    validation_passes_with_rules_and_exits_126_without_with(&["--native-nftables"]);
}

fn validation_passes_with_rules_and_exits_126_without_with(mode: &[&str]) {
    if !require_root("validation_passes_with_rules_and_exits_126_without") {
        return;
    }
    let net = two_pods();
    let bin = binary("istio-iptables");
    let bin = bin.to_str().unwrap();
    init(&net.pods[0], mode);
    let validate = [
        bin,
        "--run-validation",
        "--skip-rule-apply",
        "--probe-timeout",
        "2s",
    ];
    let out = net.pods[0].exec_as(PROXY, PROXY, &validate).unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Pod b has no rules.
    let out = net.pods[1].exec_as(PROXY, PROXY, &validate).unwrap();
    assert_eq!(
        out.status.code(),
        Some(126),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn network_namespace_flag_applies_inside_that_namespace() {
    if !require_root("network_namespace_flag_applies_inside_that_namespace") {
        return;
    }
    let net = two_pods();
    let bin = binary("istio-iptables");
    let mut args: Vec<&str> = DEFAULT_ARGS.to_vec();
    args.extend(["--network-namespace", &net.pods[0].ns]);
    let out = std::process::Command::new(&bin)
        .args(&args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let inside = net.pods[0].exec(&["iptables-save", "-t", "nat"]).unwrap();
    assert!(String::from_utf8_lossy(&inside.stdout).contains("ISTIO_OUTPUT"));
    let other = net.pods[1].exec(&["iptables-save", "-t", "nat"]).unwrap();
    assert!(!String::from_utf8_lossy(&other.stdout).contains("ISTIO_OUTPUT"));
    let missing = std::process::Command::new(&bin)
        .args(["--network-namespace", "istt-no-such-namespace"])
        .output()
        .unwrap();
    assert_eq!(missing.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("istt-no-such-namespace"));
}

#[test]
fn tproxy_rules_and_routes_apply() {
    if !require_root("tproxy_rules_and_routes_apply") {
        return;
    }
    let net = two_pods();
    let pod = &net.pods[0];
    let bin = binary("istio-iptables");
    let args = [
        bin.to_str().unwrap(),
        "-p",
        "15001",
        "-z",
        "15006",
        "-u",
        "1337",
        "-m",
        "TPROXY",
        "-i",
        "*",
        "-b",
        "*",
        "-d",
        "15090,15021,15020",
    ];
    for _ in 0..2 {
        let out = pod.exec(&args).unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let rules = pod.exec(&["ip", "rule", "show"]).unwrap();
    let rules = String::from_utf8_lossy(&rules.stdout);
    assert_eq!(
        rules.matches("fwmark 0x539 lookup 133").count(),
        1,
        "{rules}"
    );
    let routes = pod.exec(&["ip", "route", "show", "table", "133"]).unwrap();
    assert!(String::from_utf8_lossy(&routes.stdout).contains("local default dev lo"));
    let mangle = pod.exec(&["iptables-save", "-t", "mangle"]).unwrap();
    assert!(String::from_utf8_lossy(&mangle.stdout).contains("-j TPROXY"));
}

/// Where one probe of the bypass matrix ended up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Landed {
    /// Envoy's outbound port 15001, with the true original destination.
    Envoy,
    /// Envoy's inbound port 15006, with the true original destination (the proxy calling its own
    /// pod over lo is inbound traffic).
    Inbound,
    /// The destination's own listener: capture did not apply.
    Direct,
    /// No listener accepted it: the kernel refused to send it, or it left and got no answer.
    Nowhere,
}
use Landed::{Direct, Envoy, Inbound, Nowhere};

/// What a probe is sent to, in pod a with `-x <pod c> -o 9001 -c exc0` on top of the injector's args.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dest {
    /// Pod b, TCP 9000: nothing excluded.
    Remote,
    /// Pod b, TCP 9001: an `-o` excluded outbound port.
    ExcludedPort,
    /// Pod c, TCP 9000: inside the `-x` excluded CIDR.
    ExcludedCidr,
    /// Pod b over `exc0`, TCP 9000: an `-c` excluded interface.
    ExcludedInterface,
    /// 127.0.0.1 / ::1, TCP 9000 in pod a.
    Loopback,
    /// Pod a's own address, TCP 9000 (over lo).
    OwnAddress,
    /// Pod a's own address from source 127.0.0.6 / ::6 (Envoy's inbound passthrough source).
    PassthroughSourceToOwnAddress,
    /// Pod b, TCP 9000, from source 127.0.0.6 / ::6: the source exempts only on lo.
    PassthroughSourceToRemote,
    /// Pod b, UDP 9000.
    Udp,
    /// Pod b, UDP 53 (DNS capture is off).
    UdpDns,
}

/// Who sends: (name, uid, gid), in the column order of `BYPASS_ORACLE`.
const SENDERS: [(&str, u32, u32); 4] = [
    ("root", 0, 0),
    ("app", APP, APP),
    ("proxy uid", PROXY, PROXY),
    ("proxy gid only", APP, PROXY),
];

/// The documented bypass set, as a table: for each destination, where a probe from each of
/// `SENDERS` must land, for IPv4 and IPv6 alike (but for `IPV4_DIFFERS`). `None`: not probed (a
/// passthrough source off lo has no way back from pod b, so only captured senders can complete
/// it). Only the proxy's uid and gid, excluded ports, CIDRs and interfaces, loopback, the
/// passthrough source on lo and non-TCP escape Envoy.
const BYPASS_ORACLE: [(Dest, [Option<Landed>; 4]); 10] = [
    (
        Dest::Remote,
        [Some(Envoy), Some(Envoy), Some(Direct), Some(Direct)],
    ),
    (Dest::ExcludedPort, [Some(Direct); 4]),
    (Dest::ExcludedCidr, [Some(Direct); 4]),
    (Dest::ExcludedInterface, [Some(Direct); 4]),
    (Dest::Loopback, [Some(Direct); 4]),
    // The app calling its own pod directly stays local; the proxy doing so is inbound traffic.
    // A proxy-gid sender with another uid meets the uid rule's "lo and not the proxy uid" first.
    (
        Dest::OwnAddress,
        [Some(Direct), Some(Direct), Some(Inbound), Some(Direct)],
    ),
    (Dest::PassthroughSourceToOwnAddress, [Some(Direct); 4]),
    (
        Dest::PassthroughSourceToRemote,
        [Some(Envoy), Some(Envoy), None, None],
    ),
    (Dest::Udp, [Some(Direct); 4]),
    (Dest::UdpDns, [Some(Direct); 4]),
];

/// Where IPv4 differs: the kernel refuses a 127/8 source on any route but lo
/// (`route_localnet` off), so 127.0.0.6 cannot even try to leave; `::6` can, and is captured.
const IPV4_DIFFERS: [(Dest, [Option<Landed>; 4]); 1] = [(
    Dest::PassthroughSourceToRemote,
    [Some(Nowhere), Some(Nowhere), None, None],
)];

/// The addresses of one family in the bypass matrix's pods.
struct Addrs {
    a: &'static str,
    b: &'static str,
    c: &'static str,
    b_excluded_interface: &'static str,
    loopback: &'static str,
    passthrough: &'static str,
}

const V4: Addrs = Addrs {
    a: "10.233.0.2",
    b: "10.233.0.3",
    c: "10.233.0.4",
    b_excluded_interface: "10.235.0.3",
    loopback: "127.0.0.1",
    passthrough: "127.0.0.6",
};

const V6: Addrs = Addrs {
    a: "fd00:233::2",
    b: "fd00:233::3",
    c: "fd00:233::4",
    b_excluded_interface: "fd00:235::3",
    loopback: "::1",
    passthrough: "::6",
};

fn sockaddr(ip: &str, port: u16) -> String {
    if ip.contains(':') {
        format!("[{ip}]:{port}")
    } else {
        format!("{ip}:{port}")
    }
}

impl Dest {
    /// (destination, source to bind or None).
    fn target(self, f: &Addrs) -> (String, Option<&'static str>) {
        match self {
            Dest::Remote | Dest::Udp => (sockaddr(f.b, 9000), None),
            Dest::ExcludedPort => (sockaddr(f.b, 9001), None),
            Dest::ExcludedCidr => (sockaddr(f.c, 9000), None),
            Dest::ExcludedInterface => (sockaddr(f.b_excluded_interface, 9000), None),
            Dest::Loopback => (sockaddr(f.loopback, 9000), None),
            Dest::OwnAddress => (sockaddr(f.a, 9000), None),
            Dest::PassthroughSourceToOwnAddress => (sockaddr(f.a, 9000), Some(f.passthrough)),
            Dest::PassthroughSourceToRemote => (sockaddr(f.b, 9000), Some(f.passthrough)),
            Dest::UdpDns => (sockaddr(f.b, 53), None),
        }
    }

    fn udp(self) -> bool {
        matches!(self, Dest::Udp | Dest::UdpDns)
    }
}

/// The `accept` lines of every TCP listener of the matrix: (pod index, process name).
const TCP_LISTENERS: [(usize, &str); 4] =
    [(0, "recorder"), (0, "local"), (1, "server"), (2, "server")];

fn accepts(net: &Network) -> Vec<Vec<String>> {
    TCP_LISTENERS
        .iter()
        .map(|(pod, name)| {
            net.pods[*pod]
                .logs_of(name)
                .lines()
                .filter(|l| l.starts_with("accept "))
                .map(str::to_string)
                .collect()
        })
        .collect()
}

/// Sends one probe and says where it landed, from the listeners' new `accept` lines (a TCP
/// server prints its line before it answers, so a completed connect has been logged).
fn probe(net: &Network, np: &str, (uid, gid): (u32, u32), dest: Dest, f: &Addrs) -> String {
    let a = &net.pods[0];
    let (dst, src) = dest.target(f);
    if dest.udp() {
        let out = a.exec_as(uid, gid, &[np, "udp", &dst]).unwrap();
        return match String::from_utf8_lossy(&out.stdout).trim() {
            "echo 15001" => "Envoy".into(),
            answer if answer == format!("echo {}", &dst[dst.rfind(':').unwrap() + 1..]) => {
                "Direct".into()
            }
            other => format!("no answer ({other:?})"),
        };
    }
    let before = accepts(net);
    let out = match src {
        None => a.exec_as(uid, gid, &[np, "connect", &dst]),
        Some(src) => a.exec_as(uid, gid, &[np, "connect-from", src, &dst]),
    }
    .unwrap();
    let after = accepts(net);
    let new: Vec<(usize, &String)> = after
        .iter()
        .enumerate()
        .flat_map(|(i, lines)| lines[before[i].len()..].iter().map(move |l| (i, l)))
        .collect();
    if !out.status.success() {
        return if new.is_empty() {
            "Nowhere".into()
        } else {
            format!(
                "connect failed ({}), new accepts {new:?}",
                String::from_utf8_lossy(&out.stderr).trim()
            )
        };
    }
    // A listener in pod a reads its own conntrack entry, so a direct connection there shows
    // orig = the address it was sent to; in pod b and c it shows none.
    match new[..] {
        [(0, line)] if line.contains(&format!("port=15001 orig={dst} ")) => "Envoy".into(),
        [(0, line)] if line.contains(&format!("port=15006 orig={dst} ")) => "Inbound".into(),
        [(1, line)] if line.contains(&format!("orig={dst} local={dst} ")) => "Direct".into(),
        [(2 | 3, line)] if line.contains(&format!("orig=none local={dst} ")) => "Direct".into(),
        _ => format!("unexpected accepts {new:?}"),
    }
}

#[test]
fn bypass_set_is_exactly_the_documented_one_v4_and_v6() {
    bypass_set_is_exactly_the_documented_one_v4_and_v6_with(&[]);
}

/// The same with `--native-nftables` (Istio's nftables tables instead of iptables rules).
#[test]
fn bypass_set_is_exactly_the_documented_one_v4_and_v6_nftables() {
    bypass_set_is_exactly_the_documented_one_v4_and_v6_with(&["--native-nftables"]);
}

fn bypass_set_is_exactly_the_documented_one_v4_and_v6_with(mode: &[&str]) {
    if !require_root("bypass_set_is_exactly_the_documented_one_v4_and_v6") {
        return;
    }
    let mut net = two_pods();
    net.add_pod("c", 4).unwrap();
    // A second link between a and b, the one `-c` excludes.
    let (a_ns, b_ns) = (net.pods[0].ns.clone(), net.pods[1].ns.clone());
    harness::run(
        "ip",
        &[
            "link", "add", "exc0", "netns", &a_ns, "type", "veth", "peer", "name", "exc0", "netns",
            &b_ns,
        ],
    )
    .unwrap();
    for (ns, n) in [(&a_ns, 2), (&b_ns, 3)] {
        let (v4, v6) = (format!("10.235.0.{n}/24"), format!("fd00:235::{n}/64"));
        harness::run("ip", &["-n", ns, "addr", "add", &v4, "dev", "exc0"]).unwrap();
        harness::run(
            "ip",
            &["-n", ns, "-6", "addr", "add", &v6, "dev", "exc0", "nodad"],
        )
        .unwrap();
        harness::run("ip", &["-n", ns, "link", "set", "exc0", "up"]).unwrap();
    }
    let mut args = DEFAULT_ARGS.to_vec();
    assert_eq!(args[10], "-x");
    args[11] = "10.233.0.4/32,fd00:233::4/128";
    args.extend(["-o", "9001", "-c", "exc0"]);
    args.extend(mode);
    init_with(&net.pods[0], &args);

    let np = netprobe();
    let spawn = |net: &mut Network, pod: usize, name: &str, uid: u32, args: &[&str]| {
        let mut full = vec![np.as_str()];
        full.extend(args);
        net.pods[pod].spawn(name, uid, uid, &[], &full).unwrap();
        assert!(
            net.pods[pod].wait_log(name, "listening", WAIT),
            "{}",
            net.logs()
        );
    };
    spawn(&mut net, 0, "recorder", PROXY, &["listen", "15001,15006"]);
    spawn(&mut net, 0, "recorder-udp", PROXY, &["udp-echo", "15001"]);
    spawn(&mut net, 0, "local", 0, &["listen", "9000"]);
    spawn(&mut net, 1, "server", 0, &["listen", "9000,9001"]);
    spawn(&mut net, 1, "udp", 0, &["udp-echo", "9000"]);
    spawn(&mut net, 1, "dns", 0, &["udp-echo", "53"]);
    spawn(&mut net, 2, "server", 0, &["listen", "9000"]);

    let mut wrong = Vec::new();
    let mut probes = 0;
    for (family, addrs) in [("IPv4", &V4), ("IPv6", &V6)] {
        for (dest, mut expected) in BYPASS_ORACLE {
            if let (true, Some((_, v4))) = (
                family == "IPv4",
                IPV4_DIFFERS.iter().find(|(d, _)| *d == dest),
            ) {
                expected = *v4;
            }
            for ((who, uid, gid), expected) in SENDERS.into_iter().zip(expected) {
                let Some(expected) = expected else { continue };
                let landed = probe(&net, &np, (uid, gid), dest, addrs);
                probes += 1;
                if landed != format!("{expected:?}") {
                    wrong.push(format!(
                        "{family} {dest:?} from {who} ({uid}:{gid}) to {}: expected {expected:?}, got {landed}",
                        dest.target(addrs).0
                    ));
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {probes} probes landed elsewhere than the oracle says:\n{}\n{}",
        wrong.len(),
        wrong.join("\n"),
        net.logs()
    );
}

/// Inbound ports the sweep sends to: Istio's own excluded ones (15008, the tunnel port, is
/// Istio's built-in exclusion; 15090, 15021, 15020 the injector's `-d`), a user's excluded port,
/// and ordinary ones, Envoy's outbound port among them.
const INBOUND_EXCLUDED: [u16; 5] = [15008, 15020, 15021, 15090, 8443];
const INBOUND_CAPTURED: [u16; 5] = [80, 8080, 9000, 15001, 31400];

#[test]
fn inbound_sweep_captures_all_but_the_excluded_ports_v4_and_v6() {
    inbound_sweep_captures_all_but_the_excluded_ports_v4_and_v6_with(&[]);
}

/// The same with `--native-nftables`.
#[test]
fn inbound_sweep_captures_all_but_the_excluded_ports_v4_and_v6_nftables() {
    inbound_sweep_captures_all_but_the_excluded_ports_v4_and_v6_with(&["--native-nftables"]);
}

fn inbound_sweep_captures_all_but_the_excluded_ports_v4_and_v6_with(mode: &[&str]) {
    if !require_root("inbound_sweep_captures_all_but_the_excluded_ports_v4_and_v6") {
        return;
    }
    let mut net = two_pods();
    let mut args = DEFAULT_ARGS.to_vec();
    assert_eq!((args[14], args[15]), ("-d", "15090,15021,15020"));
    args[15] = "15090,15021,15020,8443";
    args.extend(mode);
    init_with(&net.pods[0], &args);
    let np = netprobe();
    // One listener process on 15006 and on every swept port, so a connection that skips capture
    // is seen at its own port, and one that is captured at 15006.
    let ports: Vec<String> = std::iter::once(15006)
        .chain(INBOUND_EXCLUDED)
        .chain(INBOUND_CAPTURED)
        .map(|p| p.to_string())
        .collect();
    net.pods[0]
        .spawn("recorder", 0, 0, &[], &[&np, "listen", &ports.join(",")])
        .unwrap();
    assert!(net.pods[0].wait_log("recorder", "listening", WAIT));
    let (a, b) = (&net.pods[0], &net.pods[1]);
    let accepts = || -> Vec<String> {
        a.logs_of("recorder")
            .lines()
            .filter(|l| l.starts_with("accept "))
            .map(str::to_string)
            .collect()
    };
    let mut wrong = Vec::new();
    let mut probes = 0;
    for ip in ["10.233.0.2", "fd00:233::2"] {
        for (port, captured) in INBOUND_EXCLUDED
            .iter()
            .map(|p| (*p, false))
            .chain(INBOUND_CAPTURED.iter().map(|p| (*p, true)))
        {
            let dst = sockaddr(ip, port);
            let before = accepts().len();
            let connected = connect(b, APP, &dst);
            let new = accepts()[before..].to_vec();
            probes += 1;
            let at = if captured { 15006 } else { port };
            // A listener reads its own conntrack entry: orig is the address sent to either way.
            let want = format!("accept port={at} orig={dst} ");
            if !connected || new.len() != 1 || !new[0].starts_with(&want) {
                wrong.push(format!(
                    "{dst}: expected `{want}`, connected {connected}, got {new:?}"
                ));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {probes} inbound probes landed elsewhere:\n{}\n{}",
        wrong.len(),
        wrong.join("\n"),
        net.logs()
    );
}

#[test]
fn validation_without_rules_fails_within_the_probe_timeout() {
    if !require_root("validation_without_rules_fails_within_the_probe_timeout") {
        return;
    }
    let net = two_pods();
    let bin = binary("istio-iptables");
    let bin = bin.to_str().unwrap();
    init(&net.pods[0], &[]);
    let validate = [
        bin,
        "--run-validation",
        "--skip-rule-apply",
        "--probe-timeout",
        "1s",
    ];
    // As the proxy uid, and so without NET_ADMIN: validation reads, it never writes rules.
    let timed = |pod: &Pod| {
        let start = std::time::Instant::now();
        let out = pod.exec_as(PROXY, PROXY, &validate).unwrap();
        (out, start.elapsed())
    };
    let (out, took) = timed(&net.pods[0]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "with rules: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(took < Duration::from_secs(5), "with rules it took {took:?}");
    // Pod b has no rules: nothing ever redirects the probe, and the timeout ends the wait;
    // then its probe packets vanish (a DROP), so no connect is ever refused either.
    for case in ["refused", "blackholed"] {
        if case == "blackholed" {
            for (cmd, dst) in [("iptables", "127.0.0.6"), ("ip6tables", "::6")] {
                let drop = [
                    cmd, "-A", "OUTPUT", "-d", dst, "-p", "tcp", "--dport", "15002", "-j", "DROP",
                ];
                assert!(net.pods[1].exec(&drop).unwrap().status.success());
            }
        }
        let (out, took) = timed(&net.pods[1]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(126), "{case}: {stderr}");
        assert!(stderr.contains("not redirected"), "{case}: {stderr}");
        assert!(
            took >= Duration::from_secs(1),
            "{case}: gave up after {took:?}, before the 1s probe timeout"
        );
        assert!(
            took < Duration::from_secs(5),
            "{case}: a 1s probe timeout took {took:?} to fail"
        );
    }
}
