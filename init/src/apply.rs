//! Applying plans to the kernel: backend detection (legacy vs nft, as Istio's
//! `dependencies/implementation_linux.go` does), the steady-state check that makes a re-run a no-op
//! (`capture/helper.go`), one `iptables-restore --noflush` per family, and cleanup.

use std::io::Write;
use std::process::{Command, Stdio};

use crate::plan::{Family, OUR_CHAINS, Plan, Position, Rule, Table};
use crate::render::{restore_payload, rule_line};

#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error("could not run {cmd}: {source}")]
    Spawn { cmd: String, source: std::io::Error },
    #[error("{cmd} failed (exit {code:?}): {stderr}")]
    Failed {
        cmd: String,
        code: Option<i32>,
        stderr: String,
    },
    #[error(
        "no working {family:?} iptables backend: tried {tried}; install iptables or pass --force-iptables-binary"
    )]
    NoBackend { family: Family, tried: String },
    #[error(
        "{family:?} rules from a different configuration are already installed ({detail}); \
         rerun with --reconcile to replace them, or --cleanup-only to remove them"
    )]
    Conflict { family: Family, detail: String },
    #[error(
        "{failed}; putting back tables {tables} as they were also failed ({rollback}): \
         check `iptables-save` and run --cleanup-only"
    )]
    RollbackFailed {
        failed: Box<ApplyError>,
        tables: String,
        rollback: Box<ApplyError>,
    },
}

/// The iptables binaries of one family and backend.
#[derive(Debug, Clone)]
pub struct Backend {
    pub family: Family,
    /// e.g. `iptables-nft`; `-save` and `-restore` are derived from it.
    pub cmd: String,
    pub legacy: bool,
}

impl Backend {
    fn save_cmd(&self) -> String {
        format!("{}-save", self.cmd)
    }
    fn restore_cmd(&self) -> String {
        format!("{}-restore", self.cmd)
    }
}

fn run(cmd: &str, args: &[&str], stdin: Option<&str>) -> Result<String, ApplyError> {
    let mut child = Command::new(cmd)
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| ApplyError::Spawn {
            cmd: cmd.to_string(),
            source,
        })?;
    if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(input.as_bytes())
            .map_err(|source| ApplyError::Spawn {
                cmd: cmd.to_string(),
                source,
            })?;
    }
    let out = child
        .wait_with_output()
        .map_err(|source| ApplyError::Spawn {
            cmd: cmd.to_string(),
            source,
        })?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(ApplyError::Failed {
            cmd: format!("{cmd} {}", args.join(" ")),
            code: out.status.code(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}

fn prefix(family: Family) -> &'static str {
    match family {
        Family::V4 => "iptables",
        Family::V6 => "ip6tables",
    }
}

/// True if the kernel has legacy (x_tables) tables loaded in this network namespace; only then
/// can `iptables-legacy-save` show rules, so the common nft case costs no process.
fn legacy_tables_loaded(family: Family) -> bool {
    let file = match family {
        Family::V4 => "/proc/net/ip_tables_names",
        Family::V6 => "/proc/net/ip6_tables_names",
    };
    std::fs::read_to_string(file).is_ok_and(|s| !s.trim().is_empty())
}

fn in_path(cmd: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(cmd).is_file()))
        .unwrap_or(false)
}

/// Picks the backend as Istio does: legacy if it already holds rules, else nft, else the plain
/// binary; `forced` ("legacy"/"nft") overrides the detection. Istio also probes each candidate by
/// adding a rule; here the apply itself is the probe: it is atomic, and `fallback` gives the next
/// candidate if the kernel refuses it.
pub fn detect(
    family: Family,
    forced: Option<crate::config::ForcedBinary>,
) -> Result<Backend, ApplyError> {
    use crate::config::ForcedBinary;
    let p = prefix(family);
    let candidate = |suffix: &str, legacy: bool| Backend {
        family,
        cmd: format!("{p}{suffix}"),
        legacy,
    };
    let no_backend = |tried: String| ApplyError::NoBackend { family, tried };
    let found = |b: Backend| {
        if in_path(&b.restore_cmd()) {
            Ok(b)
        } else {
            Err(no_backend(b.restore_cmd()))
        }
    };
    match forced {
        Some(ForcedBinary::Legacy) => return found(candidate("-legacy", true)),
        Some(ForcedBinary::Nft) => return found(candidate("-nft", false)),
        None => {}
    }
    let legacy = candidate("-legacy", true);
    if legacy_tables_loaded(family)
        && let Ok(out) = run(&legacy.save_cmd(), &[], None)
        && out.lines().filter(|l| !l.starts_with('#')).count() >= 3
    {
        return Ok(legacy);
    }
    for b in [candidate("-nft", false), candidate("", false)] {
        if in_path(&b.restore_cmd()) {
            return Ok(b);
        }
    }
    Err(no_backend(format!("{p}-legacy, {p}-nft, {p}")))
}

/// The backend to try when `failed` refused a payload on a clean namespace (e.g. a kernel
/// without nf_tables nat, istio/istio#57380): legacy after nft, if it works.
pub fn fallback(failed: &Backend) -> Option<Backend> {
    if failed.legacy {
        return None;
    }
    let legacy = Backend {
        family: failed.family,
        cmd: format!("{}-legacy", prefix(failed.family)),
        legacy: true,
    };
    (in_path(&legacy.restore_cmd()) && run(&legacy.save_cmd(), &[], None).is_ok()).then_some(legacy)
}

/// What of ours is in the kernel now, per table: our chains and the rules that mention them.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Installed {
    /// (table, chain, rule count) for each of our chains that exists.
    pub chains: Vec<(Table, String, usize)>,
    /// (table, saved line) for each rule in a builtin chain that jumps to one of our chains.
    pub jumps: Vec<(Table, String)>,
    /// (table, saved line) for each interface exclusion in nat or mangle: `-A PREROUTING -i X -j
    /// RETURN` or `-A OUTPUT -o X -j RETURN`, the shape `-c` and `-k` give. A config that
    /// excluded an interface leaves no other trace, so cleanup and reconcile take every rule of
    /// this exact shape for ours (a foreign one removed would capture more, never less).
    pub interface_returns: Vec<(Table, String)>,
}

impl Installed {
    pub fn is_empty(&self) -> bool {
        self.chains.is_empty() && self.jumps.is_empty()
    }
}

fn is_ours(chain: &str) -> bool {
    OUR_CHAINS.contains(&chain)
}

/// `PREROUTING -i X -j RETURN` or `OUTPUT -o X -j RETURN` in nat or mangle.
fn is_interface_return(table: Table, rule: &str) -> bool {
    let words: Vec<&str> = rule.split_whitespace().collect();
    matches!(table, Table::Nat | Table::Mangle)
        && matches!(
            words[..],
            ["PREROUTING", "-i", _, "-j", "RETURN"] | ["OUTPUT", "-o", _, "-j", "RETURN"]
        )
}

/// Parses `iptables-save` output.
pub fn parse_saved(saved: &str) -> Installed {
    let mut installed = Installed::default();
    let mut table = None;
    for line in saved.lines() {
        if let Some(name) = line.strip_prefix('*') {
            table = Table::from_name(name.trim());
            continue;
        }
        let Some(table) = table else { continue };
        if let Some(decl) = line.strip_prefix(':') {
            let chain = decl.split_whitespace().next().unwrap_or_default();
            if is_ours(chain) {
                installed.chains.push((table, chain.to_string(), 0));
            }
        } else if let Some(rule) = line.strip_prefix("-A ") {
            let mut words = rule.split_whitespace();
            let chain = words.next().unwrap_or_default();
            if is_ours(chain) {
                if let Some(entry) = installed
                    .chains
                    .iter_mut()
                    .find(|(t, c, _)| *t == table && c == chain)
                {
                    entry.2 += 1;
                }
            } else if rule
                .split_whitespace()
                .collect::<Vec<_>>()
                .windows(2)
                .any(|w| w[0] == "-j" && is_ours(w[1]))
            {
                installed.jumps.push((table, line.to_string()));
            } else if is_interface_return(table, rule) {
                installed.interface_returns.push((table, line.to_string()));
            }
        }
    }
    installed
}

pub fn read_installed(backend: &Backend) -> Result<Installed, ApplyError> {
    run(&backend.save_cmd(), &[], None).map(|s| parse_saved(&s))
}

fn wait_args(backend: &Backend) -> Vec<&'static str> {
    if backend.legacy {
        vec!["--wait", "30"]
    } else {
        Vec::new()
    }
}

/// True when the kernel already holds exactly `plan` (order not compared, as in Istio).
pub fn matches_plan(
    backend: &Backend,
    installed: &Installed,
    plan: &Plan,
) -> Result<bool, ApplyError> {
    for (table, chain, count) in &installed.chains {
        let expected = plan
            .rules
            .iter()
            .filter(|r| r.table == *table && r.chain == chain)
            .count();
        let referenced = plan.rules.iter().any(|r| {
            r.table == *table && (r.chain == chain || r.jump_target() == Some(chain.as_str()))
        });
        if *count != expected || !referenced {
            return Ok(false);
        }
    }
    for rule in &plan.rules {
        if !rule_exists(backend, rule)? {
            return Ok(false);
        }
    }
    Ok(true)
}

fn rule_exists(backend: &Backend, rule: &Rule) -> Result<bool, ApplyError> {
    let mut args = vec!["-t", rule.table.name(), "-C", rule.chain];
    args.extend(rule.args.iter().map(String::as_str));
    args.extend(wait_args(backend));
    match run(&backend.cmd, &args, None) {
        Ok(_) => Ok(true),
        Err(ApplyError::Failed { .. }) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Applies `payload` with one `iptables-restore --noflush`. The kernel takes each table whole or
/// not at all, but commits table by table (legacy and nft alike): see `restore_all_or_nothing`.
pub fn restore(backend: &Backend, payload: &str) -> Result<(), ApplyError> {
    let mut args = vec!["--noflush"];
    args.extend(wait_args(backend));
    run(&backend.restore_cmd(), &args, Some(payload)).map(|_| ())
}

/// The tables a restore payload names, in its order.
fn payload_tables(payload: &str) -> Vec<&str> {
    payload
        .lines()
        .filter_map(|l| l.strip_prefix('*'))
        .map(str::trim)
        .collect()
}

/// One table's block of `iptables-save -c` output (`*table` through `COMMIT`), if it is there.
fn saved_table<'a>(saved: &'a str, table: &str) -> Option<Vec<&'a str>> {
    let mut lines = saved
        .lines()
        .skip_while(|l| l.strip_prefix('*') != Some(table));
    let first = lines.next()?;
    let mut block = vec![first];
    for line in lines {
        if !line.starts_with('#') {
            block.push(line);
        }
        if line == "COMMIT" {
            break;
        }
    }
    Some(block)
}

/// A saved line without its packet counters, for comparing two saves.
fn without_counters(line: &str) -> &str {
    if line.starts_with('[') {
        return line.split_once("] ").map_or(line, |(_, rest)| rest);
    }
    match line.find(" [") {
        Some(i) if line.starts_with(':') => &line[..i],
        _ => line,
    }
}

/// The payload that puts back every table of `tables` whose rules differ between the saves
/// `before` and `after`, as it was in `before` (a table that did not exist is emptied), and
/// the names of those tables.
pub fn rollback_payload(before: &str, after: &str, tables: &[&str]) -> (String, Vec<String>) {
    let rules = |block: Option<Vec<&str>>| -> Vec<String> {
        block
            .unwrap_or_default()
            .into_iter()
            .map(|l| without_counters(l).to_string())
            .filter(|l| l.starts_with("-A") || (l.starts_with(':') && !is_builtin_decl(l)))
            .collect()
    };
    let mut payload = String::new();
    let mut changed = Vec::new();
    for table in tables {
        if rules(saved_table(before, table)) == rules(saved_table(after, table)) {
            continue;
        }
        changed.push(table.to_string());
        match saved_table(before, table) {
            Some(block) => {
                for line in block {
                    payload.push_str(line);
                    payload.push('\n');
                }
            }
            None => payload.push_str(&format!("*{table}\nCOMMIT\n")),
        }
    }
    (payload, changed)
}

/// A builtin chain's declaration (its policy is not ours to change, and never is).
fn is_builtin_decl(line: &str) -> bool {
    ["PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"]
        .iter()
        .any(|b| line.strip_prefix(':').is_some_and(|d| d.starts_with(b)))
}

/// `restore`, made all or nothing across tables. `iptables-restore` commits each table as it
/// reaches its `COMMIT`, so when a later table is refused (a kernel without the TPROXY or CT
/// module, a chain that exists), the earlier ones stay committed. For a payload of more than
/// one table the family's rules are saved first, and on failure every table this payload
/// changed is put back as it was, in one `iptables-restore` of those tables. A one-table
/// payload (the injector's default) costs nothing more.
pub fn restore_all_or_nothing(backend: &Backend, payload: &str) -> Result<(), ApplyError> {
    let tables = payload_tables(payload);
    if tables.len() < 2 {
        return restore(backend, payload);
    }
    let before = run(&backend.save_cmd(), &["-c"], None)?;
    let failed = match restore(backend, payload) {
        Ok(()) => return Ok(()),
        Err(e) => e,
    };
    match put_back(backend, &before, &tables) {
        Ok(()) => Err(failed),
        Err((rollback, changed)) => Err(ApplyError::RollbackFailed {
            failed: Box::new(failed),
            tables: changed.join(","),
            rollback: Box::new(rollback),
        }),
    }
}

/// Puts back the tables of `tables` that differ from the save `before`; on failure, the error
/// and the tables it was putting back.
fn put_back(
    backend: &Backend,
    before: &str,
    tables: &[&str],
) -> Result<(), (ApplyError, Vec<String>)> {
    let after = run(&backend.save_cmd(), &["-c"], None).map_err(|e| (e, Vec::new()))?;
    let (undo, changed) = rollback_payload(before, &after, tables);
    if changed.is_empty() {
        return Ok(());
    }
    let mut args = vec!["-c"];
    args.extend(wait_args(backend));
    run(&backend.restore_cmd(), &args, Some(&undo))
        .map(|_| ())
        .map_err(|e| (e, changed))
}

/// The payload that removes everything of ours: jumps into our chains, interface exclusions,
/// the rules `plans` put in builtin chains (e.g. TPROXY's marks) where present, then our chains.
/// Foreign rules are untouched.
pub fn cleanup_payload(
    backend: &Backend,
    installed: &Installed,
    plans: &[&Plan],
) -> Result<String, ApplyError> {
    let mut by_table: std::collections::BTreeMap<Table, Vec<String>> = Default::default();
    let mut delete = |table: Table, rest: &str| {
        let line = format!("-D {rest}");
        let lines = by_table.entry(table).or_default();
        // A rule present once must be deleted once, however many plans name it.
        if !lines.contains(&line) {
            lines.push(line);
        }
    };
    for (table, line) in installed.jumps.iter().chain(&installed.interface_returns) {
        // iptables-save output is valid restore syntax; turn the append into a delete.
        if let Some(rest) = line.strip_prefix("-A ") {
            delete(*table, rest);
        }
    }
    for rule in plans
        .iter()
        .flat_map(|p| &p.rules)
        .filter(|r| !is_ours(r.chain))
    {
        let jumps_to_ours = rule.jump_target().is_some_and(is_ours);
        if !jumps_to_ours && rule_exists(backend, rule)? {
            let as_append = Rule {
                position: Position::Append,
                ..rule.clone()
            };
            delete(rule.table, &rule_line(&as_append)[3..]);
        }
    }
    for (table, chain, _) in &installed.chains {
        by_table
            .entry(*table)
            .or_default()
            .push(format!("-F {chain}"));
    }
    for (table, chain, _) in &installed.chains {
        by_table
            .entry(*table)
            .or_default()
            .push(format!("-X {chain}"));
    }
    let mut out = String::new();
    for (table, lines) in by_table {
        out.push_str(&format!("* {}\n", table.name()));
        for line in lines {
            out.push_str(&line);
            out.push('\n');
        }
        out.push_str("COMMIT\n");
    }
    Ok(out)
}

/// What `apply_plan` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Applied,
    AlreadyInPlace,
    /// A different config was replaced in one restore transaction.
    Reconciled,
}

/// Applies one family's plan, or finds it already in place. With `reconcile`, rules of a
/// different config are replaced by ours in the same `iptables-restore` as the apply: the table
/// switches in one commit, so no connection ever sees it without capture (Istio installs DROP
/// guardrails for this window; one transaction has no window).
///
/// `others` are plans of other configs whose rules in builtin chains a reconcile removes where
/// present (the caller's TPROXY variant: its marks are no jump to our chains).
pub fn apply_plan(
    backend: &Backend,
    plan: &Plan,
    others: &[&Plan],
    force: bool,
    reconcile: bool,
) -> Result<Outcome, ApplyError> {
    // Optimistic first: on a fresh pod (the common case) the payload goes in with one process.
    // If any of our chains exists, `-N` fails and the kernel rejects the whole payload unchanged;
    // only then is the state read and compared.
    let first = if force {
        None
    } else {
        match restore_all_or_nothing(backend, &restore_payload(plan)) {
            Ok(()) => return Ok(Outcome::Applied),
            Err(e) => Some(e),
        }
    };
    let installed = read_installed(backend)?;
    if installed.is_empty() {
        return match first {
            // Nothing of ours is there, so the kernel refused the rules themselves.
            Some(e) => Err(e),
            None => {
                restore_all_or_nothing(backend, &restore_payload(plan)).map(|()| Outcome::Applied)
            }
        };
    }
    let same = matches_plan(backend, &installed, plan)?;
    if same && !force {
        return Ok(Outcome::AlreadyInPlace);
    }
    if !reconcile && !same {
        let detail = installed
            .chains
            .iter()
            .map(|(t, c, n)| format!("{}/{c}: {n} rules", t.name()))
            .collect::<Vec<_>>()
            .join(", ");
        return Err(ApplyError::Conflict {
            family: plan.family,
            detail,
        });
    }
    // Chains both configs use are flushed and refilled rather than deleted and re-created.
    let apply = restore_payload(plan);
    let mut table = None;
    let mut kept = Vec::new();
    let apply: String = apply
        .lines()
        .filter(|line| {
            if let Some(t) = line.strip_prefix("* ") {
                table = Table::from_name(t);
            }
            let recreate = line.strip_prefix("-N ").and_then(|chain| {
                installed
                    .chains
                    .iter()
                    .find(|(t, c, _)| Some(*t) == table && c == chain)
            });
            if let Some((t, c, _)) = recreate {
                kept.push((*t, c.clone()));
                return false;
            }
            true
        })
        .map(|l| format!("{l}\n"))
        .collect();
    let mut plans = vec![plan];
    plans.extend(others);
    let cleanup = cleanup_payload(backend, &installed, &plans)?;
    let cleanup: String = {
        let mut table = None;
        cleanup
            .lines()
            .filter(|line| {
                if let Some(t) = line.strip_prefix("* ") {
                    table = Table::from_name(t);
                }
                !line
                    .strip_prefix("-X ")
                    .is_some_and(|chain| kept.iter().any(|(t, c)| Some(*t) == table && c == chain))
            })
            .map(|l| format!("{l}\n"))
            .collect()
    };
    let payload = merge_payloads(&cleanup, &apply);
    restore_all_or_nothing(backend, &payload)?;
    Ok(Outcome::Reconciled)
}

/// Joins two restore payloads table by table, so each table is committed once with the first
/// payload's lines before the second's.
pub fn merge_payloads(first: &str, second: &str) -> String {
    let mut tables: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for payload in [first, second] {
        let mut current = None;
        for line in payload.lines() {
            if let Some(name) = line.strip_prefix("* ") {
                current = Some(name.to_string());
                tables.entry(name.to_string()).or_default();
            } else if line == "COMMIT" {
                current = None;
            } else if let Some(t) = &current {
                tables.entry(t.clone()).or_default().push(line.to_string());
            }
        }
    }
    let mut out = String::new();
    for (table, lines) in tables {
        out.push_str(&format!("* {table}\n"));
        for l in lines {
            out.push_str(&l);
            out.push('\n');
        }
        out.push_str("COMMIT\n");
    }
    out
}

/// Removes everything of ours for one family (`plans` as in `cleanup_payload`). Returns whether
/// anything was removed.
pub fn cleanup(backend: &Backend, plans: &[&Plan]) -> Result<bool, ApplyError> {
    let installed = read_installed(backend)?;
    let payload = cleanup_payload(backend, &installed, plans)?;
    if payload.is_empty() {
        return Ok(false);
    }
    restore_all_or_nothing(backend, &payload)?;
    Ok(true)
}

/// Routes and addresses the rules rely on (Istio's `tproxy.ConfigureRoutes`): `::6` on lo for
/// IPv6 inbound passthrough, and in TPROXY mode the fwmark rule and local route table.
/// `ip`'s flag for `family`.
fn family_flag(family: Family) -> &'static str {
    match family {
        Family::V4 => "-4",
        Family::V6 => "-6",
    }
}

/// `ip FAMILY route VERB local default dev lo table TABLE`: the TPROXY table's one route.
fn local_default_route(family: Family, verb: &str, table: &str) -> Result<String, ApplyError> {
    let default = match family {
        Family::V4 => "0.0.0.0/0",
        Family::V6 => "::/0",
    };
    let fam = family_flag(family);
    run(
        "ip",
        &[
            fam, "route", verb, "local", default, "dev", "lo", "table", table,
        ],
        None,
    )
}

pub fn configure_routes(family: Family, tproxy: Option<(u32, u32)>) -> Result<(), ApplyError> {
    let fam = family_flag(family);
    let has_v6_passthrough = || {
        std::fs::read_to_string("/proc/net/if_inet6").is_ok_and(|t| {
            t.lines()
                .any(|l| l.starts_with("00000000000000000000000000000006") && l.ends_with(" lo"))
        })
    };
    if family == Family::V6 && !has_v6_passthrough() {
        let out = std::process::Command::new("ip")
            .args(["-6", "addr", "add", "::6/128", "dev", "lo"])
            .output()
            .map_err(|source| ApplyError::Spawn {
                cmd: "ip".into(),
                source,
            })?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        if !out.status.success() && !stderr.contains("exists") && !stderr.contains("already") {
            return Err(ApplyError::Failed {
                cmd: "ip -6 addr add ::6/128 dev lo".into(),
                code: out.status.code(),
                stderr: stderr.trim().to_string(),
            });
        }
    }
    if let Some((mark, table)) = tproxy {
        let (mark, table) = (mark.to_string(), table.to_string());
        let rules = run("ip", &[fam, "rule", "show"], None)?;
        let wanted = format!("fwmark {} lookup {table}", format_mark(&mark));
        if !rules.lines().any(|l| l.contains(&wanted)) {
            run(
                "ip",
                &[fam, "rule", "add", "fwmark", &mark, "lookup", &table],
                None,
            )?;
        }
        local_default_route(family, "replace", &table)?;
    }
    Ok(())
}

/// Removes what `configure_routes` added for TPROXY mode: the `fwmark MARK lookup TABLE` rule
/// and the local default route of TABLE, if present; nothing else of the table or the rules.
/// Returns whether anything was removed.
pub fn cleanup_routes(family: Family, mark: u32, table: u32) -> Result<bool, ApplyError> {
    let fam = family_flag(family);
    let (mark, table) = (mark.to_string(), table.to_string());
    let wanted = format!("fwmark {} lookup {table}", format_mark(&mark));
    let mut removed = false;
    // `ip rule add` does not refuse a duplicate; remove every copy (bounded, in case `del`
    // succeeds without removing).
    for _ in 0..16 {
        let rules = run("ip", &[fam, "rule", "show"], None)?;
        if !rules.lines().any(|l| l.contains(&wanted)) {
            break;
        }
        run(
            "ip",
            &[fam, "rule", "del", "fwmark", &mark, "lookup", &table],
            None,
        )?;
        removed = true;
    }
    // A table that was never created is an error to `ip route show`: nothing to remove.
    let routes = run("ip", &[fam, "route", "show", "table", &table], None).unwrap_or_default();
    if routes
        .lines()
        .any(|l| l.starts_with("local default dev lo"))
    {
        local_default_route(family, "del", &table)?;
        removed = true;
    }
    Ok(removed)
}

/// `ip rule show` prints marks in hex.
fn format_mark(mark: &str) -> String {
    mark.parse::<u32>()
        .map(|m| format!("{m:#x}"))
        .unwrap_or_else(|_| mark.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merges_payloads_per_table() {
        let a = "* nat\n-D OUTPUT -j ISTIO_OUTPUT\n-F ISTIO_OUTPUT\nCOMMIT\n";
        let b = "* mangle\n-A PREROUTING -j X\nCOMMIT\n* nat\n-N ISTIO_OUTPUT\nCOMMIT\n";
        assert_eq!(
            merge_payloads(a, b),
            "* mangle\n-A PREROUTING -j X\nCOMMIT\n* nat\n-D OUTPUT -j ISTIO_OUTPUT\n-F ISTIO_OUTPUT\n-N ISTIO_OUTPUT\nCOMMIT\n"
        );
    }

    const BEFORE: &str = "\
# Generated by iptables-nft-save
*mangle
:PREROUTING ACCEPT [10:600]
:OUTPUT ACCEPT [3:180]
[5:300] -A PREROUTING -p udp --dport 9999 -j RETURN
COMMIT
*nat
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
COMMIT
";

    #[test]
    fn rollback_puts_back_only_the_tables_that_changed() {
        // The mangle table was committed (and saw traffic); nat was refused; raw did not exist.
        let after = "\
*mangle
:PREROUTING ACCEPT [90:5400]
:OUTPUT ACCEPT [7:420]
:ISTIO_DIVERT - [0:0]
[6:360] -A PREROUTING -p udp --dport 9999 -j RETURN
[0:0] -A ISTIO_DIVERT -j ACCEPT
COMMIT
*nat
:PREROUTING ACCEPT [4:240]
:OUTPUT ACCEPT [0:0]
COMMIT
*raw
:OUTPUT ACCEPT [0:0]
:ISTIO_OUTPUT_DNS - [0:0]
[0:0] -A OUTPUT -j ISTIO_OUTPUT_DNS
COMMIT
";
        let (payload, changed) = rollback_payload(BEFORE, after, &["mangle", "nat", "raw"]);
        assert_eq!(changed, ["mangle", "raw"]);
        assert_eq!(
            payload,
            "*mangle\n:PREROUTING ACCEPT [10:600]\n:OUTPUT ACCEPT [3:180]\n\
             [5:300] -A PREROUTING -p udp --dport 9999 -j RETURN\nCOMMIT\n*raw\nCOMMIT\n"
        );
    }

    #[test]
    fn counters_alone_are_no_change() {
        let after = BEFORE
            .replace("[5:300]", "[7:420]")
            .replace("[10:600]", "[11:660]");
        let (payload, changed) = rollback_payload(BEFORE, &after, &["mangle", "nat"]);
        assert!(changed.is_empty() && payload.is_empty(), "{payload}");
    }

    #[test]
    fn counts_the_tables_of_a_payload() {
        assert_eq!(
            payload_tables("* mangle\n-N X\nCOMMIT\n* nat\n-N Y\nCOMMIT\n"),
            ["mangle", "nat"]
        );
    }

    #[test]
    fn parses_saved_state() {
        let saved = "\
# Generated by iptables-nft-save
*nat
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:ISTIO_INBOUND - [0:0]
:ISTIO_OUTPUT - [0:0]
:OTHER - [0:0]
-A PREROUTING -p tcp -j ISTIO_INBOUND
-A PREROUTING -p tcp -j OTHER
-A OUTPUT -j ISTIO_OUTPUT
-A ISTIO_INBOUND -p tcp -m tcp --dport 15008 -j RETURN
-A ISTIO_OUTPUT -j RETURN
-A ISTIO_OUTPUT -d 127.0.0.1/32 -j RETURN
COMMIT
";
        let i = parse_saved(&format!(
            "{saved}*mangle\n-A OUTPUT -o eth9 -j RETURN\n-A OUTPUT -o eth9 -p tcp -j RETURN\n\
             -A INPUT -i eth9 -j RETURN\nCOMMIT\n"
        ));
        assert_eq!(
            i.interface_returns,
            vec![(Table::Mangle, "-A OUTPUT -o eth9 -j RETURN".to_string())],
            "only the exact shape of an interface exclusion is ours"
        );
        assert_eq!(
            i.chains,
            vec![
                (Table::Nat, "ISTIO_INBOUND".to_string(), 1),
                (Table::Nat, "ISTIO_OUTPUT".to_string(), 2)
            ]
        );
        assert_eq!(i.jumps.len(), 2);
        assert!(i.jumps.iter().all(|(_, l)| !l.contains("OTHER")));
    }
}
