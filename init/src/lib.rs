//! istio-init: programs iptables so that a pod's TCP traffic goes through Envoy.
//!
//! Plan first (`plan`, a typed list of rules), render second (`render`, iptables-restore format),
//! apply last (`apply`, one `iptables-restore --noflush` per IP family). Mirrors Istio's
//! `tools/istio-iptables`; see `config` for where this is stricter.

pub mod apply;
pub mod config;
pub mod nft;
pub mod plan;
pub mod render;
pub mod validation;

use std::net::IpAddr;
use std::path::Path;

use apply::{ApplyError, Outcome};
use config::{Config, InterceptionMode};
use plan::{Family, Plan, PodFacts};

/// The arguments Istio's sidecar injector gives the istio-init container (its
/// `--log_output_level` flag aside): REDIRECT mode, all outbound and inbound TCP captured except
/// the proxy's own ports 15090, 15021 and 15020, uid/gid 1337 exempt.
pub const INJECTOR_ARGS: [&str; 16] = [
    "-p",
    "15001",
    "-z",
    "15006",
    "-u",
    "1337",
    "-m",
    "REDIRECT",
    "-i",
    "*",
    "-x",
    "",
    "-b",
    "*",
    "-d",
    "15090,15021,15020",
];

/// Exit code for a failed `--run-validation`, as in Istio (`constants.ValidationErrorCode`).
pub const VALIDATION_ERROR_CODE: i32 = 126;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Config(#[from] config::ConfigError),
    #[error(transparent)]
    Apply(#[from] ApplyError),
    #[error("cannot enter network namespace {path}: {reason}")]
    Netns { path: String, reason: String },
    #[error("IPv6 rules failed ({v6}); IPv4 rollback{rollback}")]
    PartialApply { v6: ApplyError, rollback: Rollback },
    #[error(transparent)]
    Validation(#[from] validation::ValidationError),
    #[error(transparent)]
    Nft(#[from] nft::NftError),
    #[error(
        "{failed}; removing this run's nftables tables also failed ({rollback}): run --cleanup-only"
    )]
    NftRollback {
        failed: ApplyError,
        rollback: ApplyError,
    },
}

/// What became of this run's IPv4 rules after IPv6 failed (the tail of `Error::PartialApply`).
#[derive(Debug, thiserror::Error)]
pub enum Rollback {
    #[error(": IPv4 rules of this run removed")]
    Removed,
    #[error(" failed: {0}")]
    Failed(ApplyError),
    #[error(" (IPv4 had been reconciled to the new config and stays)")]
    ReconciledStays,
    #[error(" (nothing of this run to roll back)")]
    NothingApplied,
}

impl Error {
    /// The process exit code, following Istio's (126 for validation, 1 otherwise).
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::Validation(validation::ValidationError::NotRedirected { .. }) => {
                VALIDATION_ERROR_CODE
            }
            _ => 1,
        }
    }
}

/// True when this network namespace has a non-loopback, non-link-local IPv6 address.
pub fn has_global_ipv6() -> bool {
    std::fs::read_to_string("/proc/net/if_inet6")
        .map(|s| {
            s.lines().any(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                // Fields: address, ifindex, prefix length, scope, flags, name. Scope 00 = global.
                f.len() == 6 && f[3] == "00" && f[5] != "lo"
            })
        })
        .unwrap_or(false)
}

/// Nameservers listed in a resolv.conf.
pub fn parse_resolv_conf(text: &str) -> Vec<IpAddr> {
    text.lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            (words.next() == Some("nameserver"))
                .then(|| words.next()?.split('%').next()?.parse().ok())
                .flatten()
        })
        .collect()
}

/// Which families this run covers: IPv4 always, IPv6 when the pod has a global IPv6 address.
/// Istio adds IPv6 when the first address is IPv6, or with `--dual-stack` when any is: so a
/// dual-stack pod without `--dual-stack` gets IPv6 capture here too (its v6 traffic can never
/// bypass Envoy), and, as in Istio, `--dual-stack` alone adds no IPv6 rules to a pod without
/// IPv6 (a node with IPv6 disabled has no ip6tables to take them).
pub fn families(pod_has_ipv6: bool) -> Vec<Family> {
    if pod_has_ipv6 {
        vec![Family::V4, Family::V6]
    } else {
        vec![Family::V4]
    }
}

fn enter_netns(path: &str) -> Result<(), Error> {
    let full = if path.contains('/') {
        path.to_string()
    } else {
        format!("/var/run/netns/{path}")
    };
    let fail = |reason: String| Error::Netns {
        path: full.clone(),
        reason,
    };
    let file = std::fs::File::open(Path::new(&full)).map_err(|e| fail(e.to_string()))?;
    nix::sched::setns(file, nix::sched::CloneFlags::CLONE_NEWNET).map_err(|e| fail(e.to_string()))
}

/// What a run did, for the caller to report.
#[derive(Debug)]
pub struct Report {
    pub payloads: Vec<(Family, String)>,
    /// With `--native-nftables`: the `nft -f` transaction (instead of `payloads`).
    pub nft: Option<String>,
    pub outcomes: Vec<(Family, Outcome)>,
    pub cleaned: bool,
    pub validated: bool,
}

/// Gathers what the plan depends on: resolv.conf nameservers when DNS capture needs them.
pub fn pod_facts(cfg: &Config, resolv_conf: &Path) -> PodFacts {
    let mut facts = PodFacts::default();
    if cfg.redirect_dns && !cfg.capture_all_dns {
        facts.dns_servers = std::fs::read_to_string(resolv_conf)
            .map(|t| parse_resolv_conf(&t))
            .unwrap_or_default();
        if facts.dns_servers.is_empty() {
            eprintln!(
                "istio-iptables: warning: DNS capture requested but {} lists no nameserver and                  --capture-all-dns is off; DNS is not captured",
                resolv_conf.display()
            );
        }
    }
    facts
}

/// Runs istio-iptables with a validated config. All plans are built before anything touches the
/// kernel.
pub fn run(cfg: &Config) -> Result<Report, Error> {
    if let Some(ns) = &cfg.network_namespace {
        enter_netns(ns)?;
    }
    let facts = pod_facts(cfg, Path::new("/etc/resolv.conf"));
    let families = families(has_global_ipv6());
    let plans: Vec<Plan> = families
        .iter()
        .map(|f| plan::plan(cfg, *f, &facts))
        .collect();
    // What TPROXY mode puts in builtin chains (marks, no jump to our chains): cleanup and
    // reconcile remove it where present, whichever mode this run has.
    let tproxy_cfg = Config {
        mode: InterceptionMode::Tproxy,
        ..cfg.clone()
    };
    let tproxy_plans: Vec<Plan> = families
        .iter()
        .map(|f| plan::plan(&tproxy_cfg, *f, &facts))
        .collect();
    // The iptables payloads, unless the plans go to nftables instead.
    let payloads = if cfg.native_nftables {
        Vec::new()
    } else {
        plans
            .iter()
            .map(|p| (p.family, render::restore_payload(p)))
            .collect()
    };
    let mut report = Report {
        payloads,
        nft: None,
        outcomes: Vec::new(),
        cleaned: false,
        validated: false,
    };
    if cfg.native_nftables {
        let transaction = nft::transaction(&plans).map_err(nft::NftError::from)?;
        report.nft = Some(transaction.clone());
        if cfg.dry_run {
            return Ok(report);
        }
        if !cfg.skip_rule_apply {
            if cfg.cleanup_only {
                report.cleaned = nft::installed()?;
                nft::apply(&nft::cleanup_transaction())?;
                for family in &families {
                    report.cleaned |=
                        apply::cleanup_routes(*family, cfg.tproxy_mark, cfg.tproxy_route_table)?;
                }
                return Ok(report);
            }
            apply_nft(cfg, &families, &transaction, &mut report)?;
        }
    } else if cfg.dry_run {
        return Ok(report);
    } else if !cfg.skip_rule_apply {
        let backends: Vec<_> = plans
            .iter()
            .map(|p| apply::detect(p.family, cfg.force_binary))
            .collect::<Result<_, _>>()?;
        if cfg.cleanup_only {
            for ((backend, plan), tproxy) in backends.iter().zip(&plans).zip(&tproxy_plans) {
                report.cleaned |= apply::cleanup(backend, &[plan, tproxy])?;
                report.cleaned |=
                    apply::cleanup_routes(plan.family, cfg.tproxy_mark, cfg.tproxy_route_table)?;
            }
            return Ok(report);
        }
        apply_all(cfg, &backends, &plans, &tproxy_plans, &mut report)?;
    }
    if cfg.run_validation {
        let ports = [cfg.proxy_port, cfg.inbound_capture_port];
        for family in &families {
            validation::validate(
                *family == Family::V6,
                &ports,
                cfg.probe_port,
                cfg.probe_timeout,
            )?;
        }
        report.validated = true;
    }
    Ok(report)
}

/// The TPROXY mode's policy routing (mark, table), when this config needs it: as in Istio
/// (`tproxy.ConfigureRoutes`), only when inbound ports are captured.
fn tproxy_routing(cfg: &Config) -> Option<(u32, u32)> {
    (cfg.mode == InterceptionMode::Tproxy && cfg.inbound != config::InboundPorts::None)
        .then_some((cfg.tproxy_mark, cfg.tproxy_route_table))
}

/// Applies the nftables transaction (all families at once, atomically), then the routes the
/// rules rely on. If the routes fail, the tables go back to what they were before this run.
fn apply_nft(
    cfg: &Config,
    families: &[Family],
    transaction: &str,
    report: &mut Report,
) -> Result<(), Error> {
    // One `nft list tables` first (on a fresh pod the only other process is the apply): what
    // was there is what a failure of the routes puts back, and it tells a reconcile.
    let before = nft::snapshot()?;
    nft::apply(transaction)?;
    let outcome = if before.is_empty() {
        Outcome::Applied
    } else {
        Outcome::Reconciled
    };
    let tproxy = tproxy_routing(cfg);
    for family in families {
        let routed = apply::configure_routes(*family, tproxy).and_then(|()| {
            if tproxy.is_none() && outcome == Outcome::Reconciled {
                apply::cleanup_routes(*family, cfg.tproxy_mark, cfg.tproxy_route_table)?;
            }
            Ok(())
        });
        if let Err(failed) = routed {
            let restore = format!("{}{before}", nft::cleanup_transaction());
            return Err(match nft::run_nft(&restore) {
                Ok(()) => failed.into(),
                Err(rollback) => Error::NftRollback { failed, rollback },
            });
        }
        report.outcomes.push((*family, outcome));
    }
    Ok(())
}

/// Applies one family: the detected backend, then its fallback if the kernel refused the
/// payload on a clean namespace; then the routes the rules rely on.
fn apply_family(
    cfg: &Config,
    backend: &apply::Backend,
    plan: &Plan,
    tproxy: &Plan,
) -> Result<Outcome, ApplyError> {
    let apply = |b| apply::apply_plan(b, plan, &[tproxy], cfg.force_apply, cfg.reconcile);
    let outcome = match apply(backend) {
        Err(e @ ApplyError::Failed { .. }) => match apply::fallback(backend) {
            Some(legacy) => apply(&legacy).map_err(|_| e)?,
            None => return Err(e),
        },
        other => other?,
    };
    let tproxy = tproxy_routing(cfg);
    apply::configure_routes(plan.family, tproxy)?;
    if outcome == Outcome::Reconciled && tproxy.is_none() {
        // Reconciled away from TPROXY: its routing goes too, so the pod ends as a fresh apply.
        apply::cleanup_routes(plan.family, cfg.tproxy_mark, cfg.tproxy_route_table)?;
    }
    Ok(outcome)
}

/// Removes one family's rules of this run, and its TPROXY routing if this run added it.
fn undo(cfg: &Config, backend: &apply::Backend, plan: &Plan) -> Result<(), ApplyError> {
    apply::cleanup(backend, &[plan])?;
    if cfg.mode == InterceptionMode::Tproxy {
        apply::cleanup_routes(plan.family, cfg.tproxy_mark, cfg.tproxy_route_table)?;
    }
    Ok(())
}

/// Applies all families at once (each is independent and atomic on its own); if IPv6 fails
/// after IPv4 went in, the IPv4 rules of this run are removed again.
fn apply_all(
    cfg: &Config,
    backends: &[apply::Backend],
    plans: &[Plan],
    tproxy_plans: &[Plan],
    report: &mut Report,
) -> Result<(), Error> {
    let results: Vec<Result<Outcome, ApplyError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = backends
            .iter()
            .zip(plans)
            .zip(tproxy_plans)
            .map(|((backend, plan), tproxy)| {
                scope.spawn(move || apply_family(cfg, backend, plan, tproxy))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(ApplyError::Failed {
                        cmd: "apply".into(),
                        code: None,
                        stderr: "apply thread panicked".into(),
                    })
                })
            })
            .collect()
    });
    let mut v6_error = None;
    let mut v4_error = None;
    for (plan, result) in plans.iter().zip(results) {
        match result {
            Ok(outcome) => report.outcomes.push((plan.family, outcome)),
            Err(e) if plan.family == Family::V6 => v6_error = Some(e),
            Err(e) => v4_error = Some(e),
        }
    }
    if let Some(e) = v4_error {
        // IPv4 failed: undo IPv6 if this run applied it, so no family is half-captured.
        if let (Some((Family::V6, Outcome::Applied)), Some(b), Some(p)) =
            (report.outcomes.first(), backends.get(1), plans.get(1))
        {
            let _ = undo(cfg, b, p);
        }
        return Err(e.into());
    }
    if let Some(v6) = v6_error {
        // Never leave v4 captured and v6 open: undo what this run applied.
        let rollback = match (&report.outcomes[..], backends.first(), plans.first()) {
            ([(Family::V4, Outcome::Applied)], Some(b), Some(p)) => match undo(cfg, b, p) {
                Ok(()) => Rollback::Removed,
                Err(re) => Rollback::Failed(re),
            },
            ([(Family::V4, Outcome::Reconciled)], ..) => Rollback::ReconciledStays,
            _ => Rollback::NothingApplied,
        };
        return Err(Error::PartialApply { v6, rollback });
    }
    Ok(())
}

/// The command-line entry shared by `istio-iptables` and `pilot-agent istio-iptables`.
pub mod cli {
    use super::*;
    use config::Args;

    /// Runs with parsed args and returns the exit code. Logs to stderr.
    pub fn main(
        args: Args,
        lookup: &dyn Fn(&str) -> Option<String>,
        user_uid: &dyn Fn(&str) -> Option<u32>,
    ) -> i32 {
        let cfg = match Config::from_args(&args, lookup, user_uid) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("istio-iptables: {e}");
                return e_code(&Error::from(e));
            }
        };
        eprintln!("istio-iptables: config {cfg:?}");
        match run(&cfg) {
            Ok(report) => {
                if let (true, Some(transaction)) = (cfg.dry_run, &report.nft) {
                    println!("# nftables (nft -f -)\n{transaction}");
                } else if cfg.dry_run {
                    for (family, payload) in &report.payloads {
                        println!("# {family:?} (iptables-restore --noflush)\n{payload}");
                    }
                } else if cfg.cleanup_only {
                    eprintln!(
                        "istio-iptables: cleanup {}",
                        if report.cleaned {
                            "removed our rules"
                        } else {
                            "found nothing to remove"
                        }
                    );
                } else {
                    for (family, outcome) in &report.outcomes {
                        eprintln!("istio-iptables: {family:?}: {outcome:?}");
                    }
                    if report.validated {
                        eprintln!("istio-iptables: validation passed");
                    }
                }
                0
            }
            Err(e) => {
                eprintln!("istio-iptables: {e}");
                e_code(&e)
            }
        }
    }

    fn e_code(e: &Error) -> i32 {
        e.exit_code()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failed(cmd: &str) -> ApplyError {
        ApplyError::Failed {
            cmd: cmd.into(),
            code: Some(1),
            stderr: "bad".into(),
        }
    }

    #[test]
    fn partial_apply_says_what_became_of_ipv4() {
        let message = |rollback| {
            Error::PartialApply {
                v6: failed("ip6tables-restore"),
                rollback,
            }
            .to_string()
        };
        let v6 = "IPv6 rules failed (ip6tables-restore failed (exit Some(1)): bad); IPv4 rollback";
        assert_eq!(
            message(Rollback::Removed),
            format!("{v6}: IPv4 rules of this run removed")
        );
        assert_eq!(
            message(Rollback::Failed(failed("iptables-restore"))),
            format!("{v6} failed: iptables-restore failed (exit Some(1)): bad")
        );
        assert_eq!(
            message(Rollback::ReconciledStays),
            format!("{v6} (IPv4 had been reconciled to the new config and stays)")
        );
        assert_eq!(
            message(Rollback::NothingApplied),
            format!("{v6} (nothing of this run to roll back)")
        );
    }
}
