//! Startup, liveness and readiness probes as the kubelet sends them.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Probe;

use super::containers::*;
use super::*;

/// Startup, readiness and liveness probes of one container, as the kubelet runs them.
pub(super) async fn probe(inner: Arc<Inner>, run: Arc<PodRun>, p: Prepared) {
    let name = p.state.name.clone();
    loop {
        // Wait for the process.
        while run.with(&name, |c| c.pid.is_none()).unwrap_or(true) {
            if run.stopping.load(Ordering::SeqCst) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let pid = run.with(&name, |c| c.pid).flatten();
        if let Some(sp) = &p.spec.startup_probe {
            if !probe_until(&run, &p, sp, pid).await {
                // Failed its startup probe: killed, the supervisor restarts it.
                kill_pid(pid);
                continue;
            }
            run.with(&name, |c| c.started = true);
            run.changed.notify_one();
        }
        // Readiness: without a probe, ready once started (and running).
        let readiness = p.spec.readiness_probe.clone();
        let liveness = p.spec.liveness_probe.clone();
        let mut next_ready = Instant::now();
        let mut next_live = Instant::now()
            + Duration::from_secs(
                liveness
                    .as_ref()
                    .and_then(|l| l.initial_delay_seconds)
                    .unwrap_or(0) as u64,
            );
        let (mut r_ok, mut r_fail, mut l_fail) = (0, 0, 0);
        if readiness.is_none() {
            run.with(&name, |c| c.ready = c.pid.is_some());
            run.changed.notify_one();
        }
        loop {
            if run.stopping.load(Ordering::SeqCst) {
                return;
            }
            if run.with(&name, |c| c.pid).flatten() != pid {
                break; // restarted
            }
            let now = Instant::now();
            if let Some(rp) = &readiness
                && now >= next_ready
            {
                next_ready = now + period(rp);
                if probe_once(&run, &p, rp).await {
                    r_ok += 1;
                    r_fail = 0;
                    if r_ok >= rp.success_threshold.unwrap_or(1) {
                        set_ready(&run, &name, true);
                    }
                } else {
                    r_fail += 1;
                    r_ok = 0;
                    if r_fail >= rp.failure_threshold.unwrap_or(3) {
                        set_ready(&run, &name, false);
                    }
                }
            }
            if let Some(lp) = &liveness
                && now >= next_live
            {
                next_live = now + period(lp);
                if probe_once(&run, &p, lp).await {
                    l_fail = 0;
                } else {
                    l_fail += 1;
                    if l_fail >= lp.failure_threshold.unwrap_or(3) {
                        inner.say(&format!(
                            "{}/{}: {name} failed its liveness probe: restarting",
                            run.namespace, run.name
                        ));
                        kill_pid(pid);
                        break;
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

pub(super) fn set_ready(run: &PodRun, name: &str, ready: bool) {
    if run.with(name, |c| std::mem::replace(&mut c.ready, ready)) != Some(ready) {
        run.changed.notify_one();
    }
}

pub(super) fn period(p: &Probe) -> Duration {
    Duration::from_secs(p.period_seconds.unwrap_or(10).max(1) as u64)
}

/// Runs `p` until it succeeds (true) or fails `failureThreshold` times in a row (false).
pub(super) async fn probe_until(run: &PodRun, c: &Prepared, p: &Probe, pid: Option<i32>) -> bool {
    tokio::time::sleep(Duration::from_secs(
        p.initial_delay_seconds.unwrap_or(0) as u64
    ))
    .await;
    let mut failures = 0;
    loop {
        if run.stopping.load(Ordering::SeqCst)
            || run.with(&c.state.name, |s| s.pid).flatten() != pid
        {
            return false;
        }
        if probe_once(run, c, p).await {
            return true;
        }
        failures += 1;
        if failures >= p.failure_threshold.unwrap_or(3) {
            return false;
        }
        tokio::time::sleep(period(p)).await;
    }
}

pub(super) async fn probe_once(run: &PodRun, c: &Prepared, p: &Probe) -> bool {
    let timeout = Duration::from_secs(p.timeout_seconds.unwrap_or(1).max(1) as u64);
    if let Some(h) = &p.http_get {
        let Ok(port) = port_of(&c.spec, &h.port) else {
            return false;
        };
        let headers: Vec<(String, String)> = h
            .http_headers
            .iter()
            .flatten()
            .map(|h| (h.name.clone(), h.value.clone()))
            .collect();
        let host = h.host.clone().unwrap_or_else(|| run.ip.clone());
        return http_probe(
            &host,
            port,
            h.path.as_deref().unwrap_or("/"),
            &headers,
            timeout,
        )
        .await
        .is_ok_and(|code| (200..400).contains(&code));
    }
    if let Some(t) = &p.tcp_socket {
        let Ok(port) = port_of(&c.spec, &t.port) else {
            return false;
        };
        let host = t.host.clone().unwrap_or_else(|| run.ip.clone());
        return tokio::time::timeout(
            timeout,
            tokio::net::TcpStream::connect((host.as_str(), port)),
        )
        .await
        .is_ok_and(|r| r.is_ok());
    }
    if let Some(e) = &p.exec {
        let argv: Vec<String> = e.command.iter().flatten().cloned().collect();
        let prepared = Prepared { argv, ..c.clone() };
        let Ok(child) = spawn_container(run, &prepared) else {
            return false;
        };
        return tokio::time::timeout(timeout, child.wait_with_output())
            .await
            .is_ok_and(|r| r.is_ok_and(|o| o.status.success()));
    }
    false
}
