#![allow(clippy::unwrap_used)] // test code: a panic is the failure report
//! Real traffic through istio-iptables rules, IPv4 and IPv6: what must reach Envoy's ports does,
//! with the true original destination; what must bypass does; DNS lands on the agent's port;
//! reconciling lets no connection escape; validation passes with rules and exits 126 without.

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
    let bin = binary("istio-iptables");
    let mut args = vec![bin.to_str().unwrap()];
    args.extend(DEFAULT_ARGS);
    args.extend(extra);
    let out = pod.exec(&args).unwrap();
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
    if !require_root("outbound_and_inbound_capture_v4_and_v6") {
        return;
    }
    let mut net = two_pods();
    init(&net.pods[0], &[]);
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
    if !require_root("dns_to_the_resolv_conf_server_lands_on_15053") {
        return;
    }
    let mut net = two_pods();
    net.pods[0]
        .set_resolv_conf("nameserver 10.233.0.3\n")
        .unwrap();
    init(&net.pods[0], &["--redirect-dns"]);
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
    if !require_root("reconcile_lets_no_connection_escape") {
        return;
    }
    let mut net = two_pods();
    init(&net.pods[0], &[]);
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
    if !require_root("validation_passes_with_rules_and_exits_126_without") {
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
