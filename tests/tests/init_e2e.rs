#![allow(clippy::unwrap_used)] // test code: a panic is the failure report
//! istio-iptables against the real kernel, inside a fresh network namespace per test:
//! idempotent re-runs, refusal of a conflicting config without change, validation before any
//! side effect, complete cleanup that spares foreign rules, IPv6 parity and fail-closed IPv6 (a
//! pod without IPv6 needs no ip6tables), and `--dry-run` payloads that are deterministic and are
//! exactly what an apply installs.

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

/// Runs istio-iptables in `pod` with `args` and `env` added to the test's environment.
fn run_init(pod: &Pod, args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let bin = binary("istio-iptables");
    let mut full: Vec<String> = vec!["env".into()];
    full.extend(env.iter().map(|(k, v)| format!("{k}={v}")));
    full.push(bin.to_str().unwrap().into());
    full.extend(args.iter().map(|a| a.to_string()));
    let refs: Vec<&str> = full.iter().map(String::as_str).collect();
    pod.exec(&refs).unwrap()
}

/// `run_init`'s exit code and stderr.
fn init(pod: &Pod, args: &[&str], env: &[(&str, &str)]) -> (i32, String) {
    let out = run_init(pod, args, env);
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
/// address nothing outside the pod can reach) and the kernel's own link-local (`fe80::`)
/// routes, which appear when the kernel gets to it after the link is up, whatever capture does.
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
            if !line.contains("::6 ") && !line.contains("fe80::") {
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

/// Writes failing stand-ins for every IPv6 iptables binary into `dir` (a broken ip6tables, as on
/// a node whose kernel has no ip6_tables), and returns a PATH that finds them first. Each one
/// notes its call in `dir/called` before it fails.
fn broken_ip6tables_path(dir: &std::path::Path) -> String {
    std::fs::create_dir_all(dir).unwrap();
    for base in ["ip6tables", "ip6tables-nft", "ip6tables-legacy"] {
        for suffix in ["", "-save", "-restore"] {
            let p = dir.join(format!("{base}{suffix}"));
            let script = format!(
                "#!/bin/sh\necho \"$0 $*\" >> {}\necho 'stub: ip6tables is broken' >&2\nexit 4\n",
                dir.join("called").display()
            );
            std::fs::write(&p, script).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
    }
    format!(
        "{}:{}",
        dir.display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

/// True when the pod has an IPv6 address other than loopback and link-local.
fn has_global_ipv6(pod: &Pod) -> bool {
    let out = pod.exec(&["cat", "/proc/net/if_inet6"]).unwrap();
    String::from_utf8_lossy(&out.stdout).lines().any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.len() == 6 && f[3] == "00" && f[5] != "lo"
    })
}

/// A pod without IPv6 (link-local only, `disable_ipv6=1`, with or without `--dual-stack`) gets
/// its IPv4 capture and exits 0 though every ip6tables binary fails; a pod with IPv6 and a
/// broken or missing ip6tables exits 1 with no IPv4 rules left.
#[test]
fn ipv6_absent_needs_no_ip6tables_and_present_fails_closed() {
    if !require_root("ipv6_absent_needs_no_ip6tables_and_present_fails_closed") {
        return;
    }
    let mut net = Network::new().unwrap();
    net.add_pod("linklocal", 2).unwrap();
    net.add_pod("disabled", 3).unwrap();
    net.add_pod("dualstack", 4).unwrap();
    let path = broken_ip6tables_path(&net.dir().join("stub-bin"));
    // Only a link-local IPv6 address left on eth0 (the kernel's own fe80::).
    for pod in [&net.pods[0], &net.pods[2]] {
        let flush = [
            "ip", "-6", "addr", "flush", "dev", "eth0", "scope", "global",
        ];
        assert!(pod.exec(&flush).unwrap().status.success());
    }
    // IPv6 switched off in the pod, as `disable_ipv6=1` on a v4-only node.
    let off = ["sysctl", "-w", "net.ipv6.conf.all.disable_ipv6=1"];
    assert!(net.pods[1].exec(&off).unwrap().status.success());
    let cases = [
        ("link-local only", &net.pods[0], DEFAULT_ARGS.to_vec()),
        ("disable_ipv6=1", &net.pods[1], DEFAULT_ARGS.to_vec()),
        (
            "link-local only, --dual-stack",
            &net.pods[2],
            with(&DEFAULT_ARGS, &["--dual-stack"]),
        ),
    ];
    for (name, pod, args) in cases {
        assert!(!has_global_ipv6(pod), "{name}: the pod still has IPv6");
        let v6_before = snapshot(pod, "ip6tables-save");
        let (code, err) = init(pod, &args, &[("PATH", &path)]);
        assert_eq!(code, 0, "{name}: a pod without IPv6 failed: {err}");
        let v4 = snapshot(pod, "iptables-save");
        for rule in [
            "-A PREROUTING -p tcp -j ISTIO_INBOUND",
            "-A OUTPUT -j ISTIO_OUTPUT",
            "-A ISTIO_OUTPUT -j ISTIO_REDIRECT",
            "-A ISTIO_IN_REDIRECT -p tcp -j REDIRECT --to-ports 15006",
        ] {
            assert!(v4.contains(rule), "{name}: `{rule}` missing:\n{v4}");
        }
        assert_eq!(snapshot(pod, "ip6tables-save"), v6_before, "{name}");
    }
    // The stubs were never needed; and they do fail, as the IPv6 pod next shows.
    let called = std::fs::read_to_string(net.dir().join("stub-bin/called")).unwrap_or_default();
    assert_eq!(called, "", "a pod without IPv6 called ip6tables");
    net.add_pod("withv6", 5).unwrap();
    let pod = &net.pods[3];
    assert!(has_global_ipv6(pod));
    let before = state(pod);
    let (code, err) = init(pod, &DEFAULT_ARGS, &[("PATH", &path)]);
    assert_eq!(code, 1, "IPv6 present and ip6tables broken, yet: {err}");
    assert_eq!(state(pod), before, "IPv4 rules left behind: {err}");
    // IPv6 present and no ip6tables at all: refused before IPv4 is touched.
    let no_ip6 = net.dir().join("no-ip6-bin");
    std::fs::create_dir_all(&no_ip6).unwrap();
    for name in ["ip", "iptables", "iptables-nft", "iptables-legacy"]
        .iter()
        .flat_map(|b| ["", "-save", "-restore"].map(|s| format!("{b}{s}")))
        .filter(|n| !n.starts_with("ip-"))
    {
        std::os::unix::fs::symlink(find_in_path(&name), no_ip6.join(&name)).unwrap();
    }
    let (code, err) = init(pod, &DEFAULT_ARGS, &[("PATH", no_ip6.to_str().unwrap())]);
    assert_eq!(code, 1, "IPv6 present and no ip6tables, yet: {err}");
    assert!(err.contains("ip6tables"), "{err}");
    assert_eq!(state(pod), before, "IPv4 rules left behind: {err}");
}

fn with_dry_run<'a>(args: &[&'a str]) -> Vec<&'a str> {
    let mut args = args.to_vec();
    args.push("--dry-run");
    args
}

/// The `--dry-run` payloads of `args` in `pod`, by family ("V4", "V6").
fn dry_run(pod: &Pod, args: &[&str], env: &[(&str, &str)]) -> Vec<(String, String)> {
    let out = run_init(pod, &with_dry_run(args), env);
    assert!(
        out.status.success(),
        "{args:?} --dry-run: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut payloads: Vec<(String, String)> = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        if let Some(rest) = line.strip_prefix("# ") {
            let family = rest.split_whitespace().next().unwrap_or_default();
            payloads.push((family.to_string(), String::new()));
        } else if let Some((_, payload)) = payloads.last_mut() {
            payload.push_str(line);
            payload.push('\n');
        } else {
            panic!("{args:?} --dry-run: output before the first family header: {line}");
        }
    }
    payloads
}

/// One config of the golden round trip: its name, istio-iptables args and env.
type GoldenConfig = (
    &'static str,
    Vec<&'static str>,
    Vec<(&'static str, &'static str)>,
);

/// Istio's golden cases (tools/istio-iptables/pkg/capture/testdata), as injector args plus env.
fn golden_configs() -> Vec<GoldenConfig> {
    let mut service_cidrs = DEFAULT_ARGS.to_vec();
    assert_eq!((service_cidrs[8], service_cidrs[10]), ("-i", "-x"));
    service_cidrs[9] = "10.0.0.0/8,fd00:1::/64";
    service_cidrs[11] = "10.233.0.9/32,fd00:233::9/128";
    let mut inbound_ports = DEFAULT_ARGS.to_vec();
    assert_eq!(inbound_ports[12], "-b");
    inbound_ports[13] = "8080,9090";
    let mut tproxy_inbound_ports = tproxy_args();
    tproxy_inbound_ports[13] = "8080,9090";
    let d = &DEFAULT_ARGS;
    vec![
        ("no flags", vec![], vec![]),
        ("default", d.to_vec(), vec![]),
        ("tproxy", tproxy_args(), vec![]),
        ("dns capture", with(d, &["--redirect-dns"]), vec![]),
        (
            "dns capture all",
            with(d, &["--redirect-dns", "--capture-all-dns"]),
            vec![],
        ),
        (
            "tproxy + dns capture",
            with(&tproxy_args(), &["--redirect-dns"]),
            vec![],
        ),
        ("ipv4 + ipv6 service ranges", service_cidrs, vec![]),
        ("inbound ports", inbound_ports, vec![]),
        ("tproxy + inbound ports", tproxy_inbound_ports, vec![]),
        (
            "outbound ports in and out",
            with(d, &["-q", "80,443", "-o", "9001,9002"]),
            vec![],
        ),
        (
            "exclude interfaces",
            with(d, &["-c", "eth9,eth8", "-k", "veth1"]),
            vec![],
        ),
        (
            "owner groups",
            d.to_vec(),
            vec![("ISTIO_OUTBOUND_OWNER_GROUPS", "1234,5678")],
        ),
        (
            "owner groups exclude",
            d.to_vec(),
            vec![("ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE", "1234,5678")],
        ),
        ("drop invalid", with(d, &["--drop-invalid"]), vec![]),
        (
            "tproxy + drop invalid",
            with(&tproxy_args(), &["--drop-invalid"]),
            vec![],
        ),
        (
            "loopback range",
            d.to_vec(),
            vec![("ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR", "127.0.0.0/8")],
        ),
    ]
}

#[test]
fn dry_run_is_deterministic_and_is_what_apply_installs() {
    if !require_root("dry_run_is_deterministic_and_is_what_apply_installs") {
        return;
    }
    let configs = golden_configs();
    let mut net = Network::new().unwrap();
    for (i, _) in configs.iter().enumerate() {
        let n = 2 + 2 * i as u8;
        net.add_pod(&format!("applied{i}"), n).unwrap();
        net.add_pod(&format!("loaded{i}"), n + 1).unwrap();
    }
    for pod in &net.pods {
        pod.set_resolv_conf("nameserver 10.233.0.53\nnameserver fd00:233::53\n")
            .unwrap();
        seed_foreign_state(pod);
    }
    for (i, (name, args, env)) in configs.iter().enumerate() {
        let (applied, loaded) = (&net.pods[2 * i], &net.pods[2 * i + 1]);
        let payloads = dry_run(applied, args, env);
        assert_eq!(
            payloads.iter().map(|(f, _)| f.as_str()).collect::<Vec<_>>(),
            ["V4", "V6"],
            "{name}: a dual-stack pod needs both families"
        );
        assert!(
            payloads.iter().all(|(_, p)| p.contains("-A ")),
            "{name}: an empty payload proves nothing: {payloads:?}"
        );
        // Determinism: another process, and another pod with the same facts, print the same.
        assert_eq!(dry_run(applied, args, env), payloads, "{name}: run to run");
        assert_eq!(dry_run(loaded, args, env), payloads, "{name}: pod to pod");

        let rules = |s: &str| {
            s.lines()
                .filter(|l| l.starts_with("-A ") || l.starts_with("-I "))
                .count()
        };
        let foreign = [
            rules(&snapshot(applied, "iptables-save")),
            rules(&snapshot(applied, "ip6tables-save")),
        ];
        let (code, err) = init(applied, args, env);
        assert_eq!(code, 0, "{name}: {err}");
        // The payload as printed, loaded by iptables-restore itself on the same foreign state:
        // the kernel's rendering of it is the normal form both sides are compared in.
        for (family, payload) in &payloads {
            let restore = if family == "V4" {
                "iptables-restore"
            } else {
                "ip6tables-restore"
            };
            let out = std::process::Command::new("ip")
                .args(["netns", "exec", &loaded.ns, restore, "--noflush"])
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .and_then(|mut child| {
                    use std::io::Write;
                    child.stdin.take().unwrap().write_all(payload.as_bytes())?;
                    child.wait_with_output()
                })
                .unwrap();
            assert!(
                out.status.success(),
                "{name}: the printed {family} payload does not load: {}\n{payload}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        for ((family, save), foreign) in [("V4", "iptables-save"), ("V6", "ip6tables-save")]
            .into_iter()
            .zip(foreign)
        {
            let (got, want) = (snapshot(applied, save), snapshot(loaded, save));
            assert_eq!(
                got, want,
                "{name}: {family} rules applied differ from the --dry-run payload"
            );
            // Every rule of the payload is one rule in the kernel: none merged or lost.
            let payload = &payloads.iter().find(|(f, _)| f == family).unwrap().1;
            assert_eq!(
                rules(&got),
                rules(payload) + foreign,
                "{name}: {family}:\n{got}\n--- payload ---\n{payload}"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// --native-nftables

/// The pod's nftables rule set without counters, and its routing.
fn nft_state(pod: &Pod) -> String {
    let out = pod.exec(&["nft", "list", "ruleset"]).unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rules: String = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            let l = match l.find("counter packets") {
                Some(i) => {
                    let rest = &l[i..];
                    let end = rest.find(" bytes ").map_or(rest.len(), |b| {
                        b + 7 + rest[b + 7..].find(' ').unwrap_or(rest.len() - b - 7)
                    });
                    format!("{}counter{}", &l[..i], &rest[end..])
                }
                None => l.to_string(),
            };
            format!("{l}\n")
        })
        .collect();
    format!("{rules}{}", tproxy_routing(pod))
}

fn nft(args: &[&'static str]) -> Vec<&'static str> {
    let mut full = vec!["--native-nftables"];
    full.extend(args);
    full
}

#[test]
fn nftables_apply_is_idempotent_reconciles_and_cleans_up() {
    if !require_root("nftables_apply_is_idempotent_reconciles_and_cleans_up") {
        return;
    }
    let net = one_pod();
    let pod = &net.pods[0];
    let empty = nft_state(pod);
    let (code, err) = init(pod, &nft(&DEFAULT_ARGS), &[]);
    assert_eq!(code, 0, "{err}");
    let first = nft_state(pod);
    for want in [
        "table inet istio-proxy-nat",
        "chain istio-output",
        "redirect to :15001",
        "redirect to :15006",
    ] {
        assert!(first.contains(want), "{want} missing:\n{first}");
    }
    // No iptables rules: the capture is nft's own tables only.
    assert!(!state(pod).contains("ISTIO"), "{}", state(pod));
    // The same config again: the same rule set.
    let (code, err) = init(pod, &nft(&DEFAULT_ARGS), &[]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(nft_state(pod), first);
    // TPROXY with DNS capture and drop-invalid: all three tables and the policy routing.
    let tproxy = with(
        &nft(&tproxy_args()),
        &["--redirect-dns", "--capture-all-dns", "--drop-invalid"],
    );
    let (code, err) = init(pod, &tproxy, &[]);
    assert_eq!(code, 0, "{err}");
    let t = nft_state(pod);
    for want in [
        "table inet istio-proxy-mangle",
        "table inet istio-proxy-raw",
        "tproxy ip to :15006",
        "ct zone set 1",
        "fwmark 0x539 lookup 133",
    ] {
        assert!(t.contains(want), "{want} missing:\n{t}");
    }
    // Back to REDIRECT: as a fresh apply, no mangle or raw table and no policy routing left
    // (Istio's nftables mode flushes only the tables the new config uses).
    let (code, err) = init(pod, &nft(&DEFAULT_ARGS), &[]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(nft_state(pod), first);
    // Cleanup: nothing of ours is left.
    let (code, err) = init(pod, &nft(&["--cleanup-only"]), &[]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(nft_state(pod), empty);
    let (code, err) = init(pod, &nft(&["--cleanup-only"]), &[]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("found nothing to remove"), "{err}");
}

#[test]
fn nftables_failure_leaves_the_kernel_as_it_was() {
    if !require_root("nftables_failure_leaves_the_kernel_as_it_was") {
        return;
    }
    let net = one_pod();
    let pod = &net.pods[0];
    let (code, err) = init(pod, &nft(&DEFAULT_ARGS), &[]);
    assert_eq!(code, 0, "{err}");
    let before = nft_state(pod);
    // An nft that adds a broken rule at the end of every transaction: the kernel refuses the
    // whole of it, after the new tables were created within it.
    let dir = tempfile::tempdir().unwrap();
    let real = find_in_path("nft");
    let wrapper = dir.path().join("nft");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nif [ \"$1\" = -f ]; then {{ cat; echo 'add rule inet istio-proxy-nat no-such-chain counter'; }} | {} -f -; else exec {} \"$@\"; fi\n",
            real.display(),
            real.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!(
        "{}:{}",
        dir.path().display(),
        std::env::var("PATH").unwrap()
    );
    let tproxy = nft(&tproxy_args());
    let (code, err) = init(pod, &tproxy, &[("PATH", &path)]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("nft -f -") && err.contains("no-such-chain"),
        "{err}"
    );
    assert_eq!(
        nft_state(pod),
        before,
        "a refused transaction changed the kernel"
    );

    // No nft at all: a named error before anything is touched.
    let (code, err) = init(pod, &tproxy, &[("PATH", "/nonexistent")]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("needs the nft binary"), "{err}");
    assert_eq!(nft_state(pod), before);

    // Dry run: the transaction is printed and nothing changes.
    let out = run_init(pod, &with(&tproxy, &["--dry-run"]), &[]);
    assert!(out.status.success());
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        printed.contains("add rule inet istio-proxy-mangle istio-tproxy meta l4proto tcp"),
        "{printed}"
    );
    assert_eq!(nft_state(pod), before);
}
