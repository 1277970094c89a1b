#![allow(clippy::unwrap_used)] // test code: a panic is the failure report
//! istio-iptables against the real kernel, inside a fresh network namespace per test:
//! idempotent re-runs, refusal of a conflicting config without change, validation before any
//! side effect, complete cleanup that spares foreign rules, IPv6 parity and fail-closed IPv6.

use std::os::unix::fs::PermissionsExt;

use harness::INJECTOR_INIT_ARGS as DEFAULT_ARGS;
use harness::{Network, Pod, binary, require_root};

/// `iptables-save` without comments, counters and empty tables (a table the kernel loaded but that
/// holds nothing is no rule), so snapshots compare by rules only.
fn snapshot(pod: &Pod, cmd: &str) -> String {
    const BUILTIN: [&str; 5] = ["PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"];
    let out = pod.exec(&[cmd]).unwrap();
    assert!(
        out.status.success(),
        "{cmd}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut kept = Vec::new();
    let mut block: Vec<String> = Vec::new();
    let mut substantial = false;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let line = match line.find(" [") {
            Some(i) if line.starts_with(':') => &line[..i],
            _ => line,
        };
        if line.starts_with('*') {
            block.clear();
            substantial = false;
        }
        let builtin_decl = line
            .strip_prefix(':')
            .is_some_and(|d| BUILTIN.iter().any(|b| d.starts_with(b)));
        if line.starts_with("-A") || (line.starts_with(':') && !builtin_decl) {
            substantial = true;
        }
        block.push(line.to_string());
        if line == "COMMIT" && substantial {
            kept.append(&mut block);
        }
    }
    kept.join("\n")
}

fn state(pod: &Pod) -> String {
    format!(
        "{}\n{}",
        snapshot(pod, "iptables-save"),
        snapshot(pod, "ip6tables-save")
    )
}

fn init(pod: &Pod, args: &[&str], env: &[(&str, &str)]) -> (i32, String) {
    let bin = binary("istio-iptables");
    let mut full: Vec<String> = vec!["env".into()];
    full.extend(env.iter().map(|(k, v)| format!("{k}={v}")));
    full.push(bin.to_str().unwrap().into());
    full.extend(args.iter().map(|a| a.to_string()));
    let refs: Vec<&str> = full.iter().map(String::as_str).collect();
    let out = pod.exec(&refs).unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn one_pod() -> Network {
    let mut net = Network::new().unwrap();
    net.add_pod("pod", 2).unwrap();
    net
}

#[test]
fn rerun_with_same_config_changes_nothing() {
    if !require_root("rerun_with_same_config_changes_nothing") {
        return;
    }
    let net = one_pod();
    let pod = &net.pods[0];
    let (code, err) = init(pod, &DEFAULT_ARGS, &[]);
    assert_eq!(code, 0, "{err}");
    let first = state(pod);
    assert!(first.contains("-A ISTIO_OUTPUT"), "{first}");
    let (code, err) = init(pod, &DEFAULT_ARGS, &[]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("AlreadyInPlace"), "{err}");
    assert_eq!(state(pod), first);
}

#[test]
fn conflicting_config_is_refused_without_change() {
    if !require_root("conflicting_config_is_refused_without_change") {
        return;
    }
    let net = one_pod();
    let pod = &net.pods[0];
    assert_eq!(init(pod, &DEFAULT_ARGS, &[]).0, 0);
    let before = state(pod);
    let mut other = DEFAULT_ARGS.to_vec();
    other[15] = "15090";
    let (code, err) = init(pod, &other, &[]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("--reconcile"), "{err}");
    assert_eq!(state(pod), before);
}

#[test]
fn invalid_input_exits_nonzero_and_touches_nothing() {
    if !require_root("invalid_input_exits_nonzero_and_touches_nothing") {
        return;
    }
    let net = one_pod();
    let pod = &net.pods[0];
    let before = state(pod);
    type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], &'a str);
    let cases: [Case; 7] = [
        (&["-p", "0"], &[], "--envoy-port"),
        (&["-d", "15020,65536"], &[], "--istio-local-exclude-ports"),
        (&["-b", "80a"], &[], "--istio-inbound-ports"),
        (&["-i", "10.0.0.0/33"], &[], "--istio-service-cidr"),
        (&["-c=-j ACCEPT"], &[], "--istio-exclude-interfaces"),
        (
            &["--force-iptables-binary", "both"],
            &[],
            "--force-iptables-binary",
        ),
        (
            &[],
            &[("ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR", "10.0.0.1/32")],
            "ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR",
        ),
    ];
    for (args, env, named) in cases {
        let (code, err) = init(pod, args, env);
        assert_eq!(code, 1, "{args:?}: {err}");
        assert!(
            err.contains(named),
            "{args:?}: message does not name {named}: {err}"
        );
        assert_eq!(state(pod), before, "{args:?} changed the kernel state");
    }
    // An unparseable command line exits 255, as Istio's does.
    assert_eq!(init(pod, &["--no-such-flag"], &[]).0, 255);
}

#[test]
fn cleanup_removes_ours_and_spares_foreign_rules() {
    if !require_root("cleanup_removes_ours_and_spares_foreign_rules") {
        return;
    }
    let net = one_pod();
    let pod = &net.pods[0];
    for cmd in [
        vec!["iptables", "-t", "nat", "-N", "FOREIGN"],
        vec![
            "iptables", "-t", "nat", "-A", "OUTPUT", "-p", "udp", "--dport", "9999", "-j",
            "FOREIGN",
        ],
        vec![
            "iptables",
            "-t",
            "nat",
            "-A",
            "PREROUTING",
            "-p",
            "tcp",
            "--dport",
            "9998",
            "-j",
            "RETURN",
        ],
        vec![
            "ip6tables",
            "-t",
            "nat",
            "-A",
            "OUTPUT",
            "-p",
            "tcp",
            "--dport",
            "9997",
            "-j",
            "RETURN",
        ],
    ] {
        assert!(pod.exec(&cmd).unwrap().status.success(), "{cmd:?}");
    }
    let before = state(pod);
    let mut with_excludes = DEFAULT_ARGS.to_vec();
    with_excludes.extend(["-c", "eth9"]);
    assert_eq!(init(pod, &with_excludes, &[]).0, 0);
    assert_ne!(state(pod), before);
    let mut cleanup = with_excludes.clone();
    cleanup.push("--cleanup-only");
    let (code, err) = init(pod, &cleanup, &[]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(state(pod), before);
    // Cleaning a clean namespace is fine.
    assert_eq!(init(pod, &cleanup, &[]).0, 0);
}

#[test]
fn ipv6_gets_the_same_rules() {
    if !require_root("ipv6_gets_the_same_rules") {
        return;
    }
    let net = one_pod();
    let pod = &net.pods[0];
    assert_eq!(init(pod, &DEFAULT_ARGS, &[]).0, 0);
    let v4 = snapshot(pod, "iptables-save");
    let v6 = snapshot(pod, "ip6tables-save");
    let normalized = v4
        .replace("127.0.0.6/32", "::6/128")
        .replace("127.0.0.1/32", "::1/128");
    let rules = |s: &str| {
        s.lines()
            .filter(|l| l.contains("ISTIO"))
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    assert!(
        !rules(&v6).is_empty(),
        "no IPv6 rules although the pod has an IPv6 address"
    );
    assert_eq!(rules(&normalized), rules(&v6));
}

#[test]
fn ipv6_failure_rolls_back_ipv4() {
    if !require_root("ipv6_failure_rolls_back_ipv4") {
        return;
    }
    let net = one_pod();
    let pod = &net.pods[0];
    let before = state(pod);
    // Shadow the IPv6 restore binaries with ones that fail, as a broken ip6tables would.
    let stub = net.dir().join("stub-bin");
    std::fs::create_dir_all(&stub).unwrap();
    for name in [
        "ip6tables-restore",
        "ip6tables-nft-restore",
        "ip6tables-legacy-restore",
    ] {
        let p = stub.join(name);
        std::fs::write(
            &p,
            "#!/bin/sh\necho 'stub: ip6tables-restore refused' >&2\nexit 4\n",
        )
        .unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let path = format!(
        "{}:{}",
        stub.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let (code, err) = init(pod, &DEFAULT_ARGS, &[("PATH", &path)]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("IPv6 rules failed") && !err.contains("rollback failed"),
        "{err}"
    );
    assert_eq!(
        state(pod),
        before,
        "IPv4 rules left behind after the IPv6 apply failed"
    );
}

#[test]
fn dry_run_prints_payload_and_touches_nothing() {
    if !require_root("dry_run_prints_payload_and_touches_nothing") {
        return;
    }
    let net = one_pod();
    let pod = &net.pods[0];
    let before = state(pod);
    let bin = binary("istio-iptables");
    let mut args = vec![bin.to_str().unwrap()];
    args.extend(DEFAULT_ARGS);
    args.push("-n");
    let out = pod.exec(&args).unwrap();
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("-A ISTIO_OUTPUT -j ISTIO_REDIRECT"),
        "{stdout}"
    );
    assert_eq!(state(pod), before);
}
