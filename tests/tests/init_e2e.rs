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

/// What TPROXY mode routes by: the policy rules of both families and every route table, less
/// the `::6` passthrough address IPv6 capture puts on lo (it stays, as in Istio: a loopback
/// address nothing outside the pod can reach).
fn routing(pod: &Pod) -> String {
    let mut out = String::new();
    for args in [
        ["ip", "-4", "rule", "show", ""],
        ["ip", "-6", "rule", "show", ""],
        ["ip", "-4", "route", "show", "table"],
        ["ip", "-6", "route", "show", "table"],
    ] {
        let mut args: Vec<&str> = args.into_iter().filter(|a| !a.is_empty()).collect();
        if args.last() == Some(&"table") {
            args.push("all");
        }
        let text = pod.exec(&args).unwrap();
        for line in String::from_utf8_lossy(&text.stdout).lines() {
            if !line.contains("::6 ") {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out
}

/// The TPROXY policy rule and route table of a pod (which, unlike `routing`, names no pod address).
fn tproxy_routing(pod: &Pod) -> String {
    let mut out = String::new();
    for fam in ["-4", "-6"] {
        let rules = pod.exec(&["ip", fam, "rule", "show"]).unwrap();
        let routes = pod
            .exec(&["ip", fam, "route", "show", "table", "133"])
            .unwrap();
        out.push_str(&String::from_utf8_lossy(&rules.stdout));
        out.push_str(&String::from_utf8_lossy(&routes.stdout));
    }
    out
}

/// `state` with each table's chain declarations sorted: the kernel lists chains in creation
/// order, which says nothing about what the rules do.
fn state_unordered_chains(pod: &Pod) -> String {
    let mut out = Vec::new();
    let mut decls = Vec::new();
    for line in state(pod).lines() {
        if line.starts_with(':') {
            decls.push(line.to_string());
            continue;
        }
        decls.sort();
        out.append(&mut decls);
        out.push(line.to_string());
    }
    out.join("\n")
}

/// Foreign rules in every table capture uses, both families, and a foreign policy rule and
/// route table: what must survive any failure or cleanup of ours.
fn seed_foreign_state(pod: &Pod) {
    for cmd in ["iptables", "ip6tables"] {
        for (table, chain) in [
            ("nat", "OUTPUT"),
            ("nat", "PREROUTING"),
            ("mangle", "PREROUTING"),
            ("mangle", "OUTPUT"),
            ("raw", "OUTPUT"),
            ("raw", "PREROUTING"),
        ] {
            let args = [
                cmd, "-t", table, "-A", chain, "-p", "udp", "--dport", "9999", "-j", "RETURN",
            ];
            assert!(pod.exec(&args).unwrap().status.success(), "{args:?}");
        }
        let new = [cmd, "-t", "mangle", "-N", "FOREIGN"];
        assert!(pod.exec(&new).unwrap().status.success());
        let jump = [
            cmd, "-t", "mangle", "-A", "OUTPUT", "-p", "tcp", "--dport", "9998", "-j", "FOREIGN",
        ];
        assert!(pod.exec(&jump).unwrap().status.success());
    }
    for args in [
        ["ip", "-4", "rule", "add", "fwmark", "7", "lookup", "77"],
        ["ip", "-6", "rule", "add", "fwmark", "7", "lookup", "77"],
    ] {
        assert!(pod.exec(&args).unwrap().status.success(), "{args:?}");
    }
    let route = [
        "ip",
        "route",
        "add",
        "local",
        "10.77.0.0/16",
        "dev",
        "lo",
        "table",
        "77",
    ];
    assert!(pod.exec(&route).unwrap().status.success());
}

fn with(base: &[&'static str], extra: &[&'static str]) -> Vec<&'static str> {
    let mut args = base.to_vec();
    args.extend(extra);
    args
}

/// TPROXY mode as the injector configures it (`sidecar.istio.io/interceptionMode: TPROXY`).
fn tproxy_args() -> Vec<&'static str> {
    let mut args = DEFAULT_ARGS.to_vec();
    assert_eq!(args[7], "REDIRECT");
    args[7] = "TPROXY";
    args
}

/// Multi-table configs: DNS capture (nat + raw), TPROXY (mangle + nat), both (three tables).
fn multi_table_configs() -> Vec<(&'static str, Vec<&'static str>)> {
    vec![
        ("dns capture", with(&DEFAULT_ARGS, &["--redirect-dns"])),
        ("tproxy", tproxy_args()),
        (
            "tproxy + dns capture",
            with(&tproxy_args(), &["--redirect-dns"]),
        ),
    ]
}

fn find_in_path(name: &str) -> std::path::PathBuf {
    std::env::split_paths(&std::env::var_os("PATH").unwrap())
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{name} is not in PATH"))
}

#[test]
fn failure_in_a_later_table_leaves_the_kernel_as_it_was() {
    if !require_root("failure_in_a_later_table_leaves_the_kernel_as_it_was") {
        return;
    }
    let net = one_pod();
    let pod = &net.pods[0];
    pod.set_resolv_conf("nameserver 10.233.0.53\nnameserver fd00:233::53\n")
        .unwrap();
    seed_foreign_state(pod);
    let before = (state(pod), routing(pod));
    // iptables-restore commits table by table: a kernel that refuses the last table of the
    // payload (no xt_CT for raw's zones, no xt_TPROXY) leaves the earlier ones committed. The
    // stubs model that kernel for IPv4: the real binary gets every table but the last of an
    // apply (`--noflush`), then the stub fails; anything else (a putting back) passes through.
    let stub = net.dir().join("stub-bin");
    std::fs::create_dir_all(&stub).unwrap();
    for name in [
        "iptables-restore",
        "iptables-nft-restore",
        "iptables-legacy-restore",
    ] {
        let real = find_in_path(name);
        let script = format!(
            r#"#!/bin/sh
payload=$(cat)
case " $* " in *" --noflush "*) ;; *) printf '%s\n' "$payload" | exec {real} "$@" ;; esac
tables=$(printf '%s\n' "$payload" | grep -c '^\*')
if [ "$tables" -lt 2 ]; then printf '%s\n' "$payload" | exec {real} "$@"; fi
printf '%s\n' "$payload" | awk -v n="$tables" '/^\*/ {{ t++ }} t < n {{ print }}' | {real} "$@" || exit $?
echo "stub: the kernel refused table $tables of $tables" >&2
exit 1
"#,
            real = real.display()
        );
        let p = stub.join(name);
        std::fs::write(&p, script).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let path = format!(
        "{}:{}",
        stub.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    for (name, args) in multi_table_configs() {
        let (code, err) = init(pod, &args, &[("PATH", &path)]);
        assert_ne!(
            code, 0,
            "{name}: the stub refused a table, yet exit 0: {err}"
        );
        assert!(err.contains("stub: the kernel refused"), "{name}: {err}");
        assert_eq!(
            (state(pod), routing(pod)),
            before,
            "{name}: tables committed before the refused one were left behind ({err})"
        );
    }
    // Without the stub each of them applies, so it was the refused table that failed them.
    for (name, args) in multi_table_configs() {
        let (code, err) = init(pod, &args, &[]);
        assert_eq!(code, 0, "{name}: {err}");
        let (code, err) = init(pod, &with(&args, &["--cleanup-only"]), &[]);
        assert_eq!(code, 0, "{name}: {err}");
        assert_eq!((state(pod), routing(pod)), before, "{name}");
    }
}

#[test]
fn conflicting_multi_table_config_is_refused_without_change() {
    if !require_root("conflicting_multi_table_config_is_refused_without_change") {
        return;
    }
    let net = one_pod();
    let pod = &net.pods[0];
    pod.set_resolv_conf("nameserver 10.233.0.53\n").unwrap();
    // DNS capture holds nat and raw; TPROXY's payload is mangle then nat. The kernel takes its
    // mangle table, then refuses nat (ISTIO_INBOUND exists): mangle must not stay.
    let (code, err) = init(pod, &with(&DEFAULT_ARGS, &["--redirect-dns"]), &[]);
    assert_eq!(code, 0, "{err}");
    let before = state(pod);
    let (code, err) = init(pod, &tproxy_args(), &[]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("--reconcile"), "{err}");
    assert_eq!(state(pod), before, "a refused config left rules behind");
}

#[test]
fn reconcile_ends_as_a_fresh_apply() {
    if !require_root("reconcile_ends_as_a_fresh_apply") {
        return;
    }
    let dns_and_excludes = with(
        &DEFAULT_ARGS,
        &[
            "--redirect-dns",
            "-o",
            "9001",
            "-c",
            "eth9",
            "--drop-invalid",
        ],
    );
    let mut fewer_ports = DEFAULT_ARGS.to_vec();
    fewer_ports[15] = "15090";
    fewer_ports[11] = "10.9.0.0/16,fd00:9::/32";
    let pairs: Vec<(&str, Vec<&str>, Vec<&str>)> = vec![
        (
            "default -> dns, excludes",
            DEFAULT_ARGS.to_vec(),
            dns_and_excludes.clone(),
        ),
        (
            "dns, excludes -> other excludes",
            dns_and_excludes,
            fewer_ports,
        ),
        (
            "default -> tproxy + dns",
            DEFAULT_ARGS.to_vec(),
            with(&tproxy_args(), &["--redirect-dns"]),
        ),
        (
            "tproxy + dns -> default",
            with(&tproxy_args(), &["--redirect-dns"]),
            DEFAULT_ARGS.to_vec(),
        ),
    ];
    let mut net = Network::new().unwrap();
    for (i, _) in pairs.iter().enumerate() {
        let n = 2 + 2 * i as u8;
        net.add_pod(&format!("reconciled{i}"), n).unwrap();
        net.add_pod(&format!("fresh{i}"), n + 1).unwrap();
    }
    for pod in &net.pods {
        pod.set_resolv_conf("nameserver 10.233.0.53\nnameserver fd00:233::53\n")
            .unwrap();
    }
    for (i, (name, from, to)) in pairs.iter().enumerate() {
        let (reconciled, fresh) = (&net.pods[2 * i], &net.pods[2 * i + 1]);
        let (code, err) = init(reconciled, from, &[]);
        assert_eq!(code, 0, "{name}: {err}");
        let (code, err) = init(reconciled, &with(to, &["--reconcile"]), &[]);
        assert_eq!(code, 0, "{name}: {err}");
        assert!(err.contains("Reconciled"), "{name}: {err}");
        let (code, err) = init(fresh, to, &[]);
        assert_eq!(code, 0, "{name}: {err}");
        assert_eq!(
            state_unordered_chains(reconciled),
            state_unordered_chains(fresh),
            "{name}: the reconciled rules differ from a fresh apply"
        );
        assert_eq!(
            tproxy_routing(reconciled),
            tproxy_routing(fresh),
            "{name}: the reconciled TPROXY routing differs from a fresh apply"
        );
    }
}

#[test]
fn cleanup_after_tproxy_and_dns_capture_restores_the_pod() {
    if !require_root("cleanup_after_tproxy_and_dns_capture_restores_the_pod") {
        return;
    }
    let net = one_pod();
    let pod = &net.pods[0];
    pod.set_resolv_conf("nameserver 10.233.0.53\nnameserver fd00:233::53\n")
        .unwrap();
    seed_foreign_state(pod);
    let before = (state(pod), routing(pod));
    for (name, args) in multi_table_configs() {
        let (code, err) = init(pod, &args, &[]);
        assert_eq!(code, 0, "{name}: {err}");
        let installed = (state(pod), routing(pod));
        assert_ne!(installed.0, before.0, "{name}: nothing installed");
        if name.contains("tproxy") {
            assert!(
                installed.1.contains("fwmark 0x539 lookup 133"),
                "{name}: {}",
                installed.1
            );
        }
        if name.contains("dns") {
            assert!(
                installed.0.contains("-A OUTPUT -j ISTIO_OUTPUT_DNS"),
                "{name}"
            );
        }
        let (code, err) = init(pod, &with(&args, &["--cleanup-only"]), &[]);
        assert_eq!(code, 0, "{name}: {err}");
        assert_eq!(
            (state(pod), routing(pod)),
            before,
            "{name}: cleanup left something behind"
        );
    }
}
