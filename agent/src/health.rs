//! The VM health checker (Istio's `pkg/istio-agent/health`): ProxyConfig `readinessProbe` (a
//! WorkloadGroup's `probe`) run with Envoy's readiness, judged over its thresholds, and each
//! change of verdict published for the xDS proxy, which reports it to istiod on the control
//! plane stream as a `HealthInformation` request (healthy: nothing else set; unhealthy:
//! `error_detail` code 13 with the reason). istiod then sets the WorkloadEntry's `Healthy`
//! condition, and sends the VM's address to other proxies only while it is `True`.

use std::future::Future;
use std::net::IpAddr;

use bytes::Bytes;
use prost::Message;
use tokio::sync::watch;

use crate::config::health::{HealthProbe, Method};
use crate::config::probes::Probe;

/// The type istiod reads health reports by (`model.HealthInfoType`).
pub use mesh_common::xds::HEALTH_INFO_TYPE;

/// A verdict of the health checker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Health {
    Healthy,
    Unhealthy(String),
}

/// The latest verdict (`None` before the first one).
pub type HealthWatch = watch::Receiver<Option<Health>>;

/// The report of `health` as a request on a state-of-the-world or Delta stream.
pub fn request(delta: bool, health: &Health) -> Bytes {
    use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DiscoveryRequest};
    use envoy_types::pb::google::rpc::Status;
    let error_detail = match health {
        Health::Healthy => None,
        // codes.Internal, as Istio's agent reports a failed probe.
        Health::Unhealthy(why) => Some(Status {
            code: 13,
            message: why.clone(),
            details: Vec::new(),
        }),
    };
    let bytes = if delta {
        DeltaDiscoveryRequest {
            type_url: HEALTH_INFO_TYPE.into(),
            error_detail,
            ..Default::default()
        }
        .encode_to_vec()
    } else {
        DiscoveryRequest {
            type_url: HEALTH_INFO_TYPE.into(),
            error_detail,
            ..Default::default()
        }
        .encode_to_vec()
    };
    Bytes::from(bytes)
}

/// The thresholds: a verdict once `success_threshold` passes or `failure_threshold` failures
/// come in a row, and only when it changes (the first always counts).
#[derive(Debug)]
struct Judge {
    successes: u32,
    failures: u32,
    last: Option<bool>,
    success_threshold: u32,
    failure_threshold: u32,
}

impl Judge {
    fn new(probe: &HealthProbe) -> Judge {
        Judge {
            successes: 0,
            failures: 0,
            last: None,
            success_threshold: probe.success_threshold.max(1),
            failure_threshold: probe.failure_threshold.max(1),
        }
    }

    fn observe(&mut self, outcome: Result<(), String>) -> Option<Health> {
        match outcome {
            Ok(()) => {
                self.successes += 1;
                self.failures = 0;
                if self.successes >= self.success_threshold && self.last != Some(true) {
                    self.successes = 0;
                    self.last = Some(true);
                    return Some(Health::Healthy);
                }
            }
            Err(why) => {
                self.failures += 1;
                self.successes = 0;
                if self.failures >= self.failure_threshold && self.last != Some(false) {
                    self.failures = 0;
                    self.last = Some(false);
                    return Some(Health::Unhealthy(why));
                }
            }
        }
        None
    }
}

/// Where a probe with `host` goes: that address, `localhost` as loopback, a name as it
/// resolves now; without a host, `default` (the proxy's address, or loopback with
/// REWRITE_PROBE_LEGACY_LOCALHOST_DESTINATION).
async fn target(host: Option<&str>, default: IpAddr) -> Result<IpAddr, String> {
    match host {
        None => Ok(default),
        Some("localhost") => Ok(IpAddr::from([127, 0, 0, 1])),
        Some(h) => match h.parse::<IpAddr>() {
            Ok(ip) => Ok(ip),
            Err(_) => tokio::net::lookup_host((h, 0))
                .await
                .map_err(|e| format!("probe host {h}: {e}"))?
                .next()
                .map(|a| a.ip())
                .ok_or_else(|| format!("probe host {h}: no address")),
        },
    }
}

/// Runs the probe's method once.
pub async fn probe_once(probe: &HealthProbe, default_host: IpAddr) -> Result<(), String> {
    match &probe.method {
        Method::Check { check, host } => {
            let ip = target(host.as_deref(), default_host).await?;
            crate::probes::run(
                &Probe {
                    check: check.clone(),
                    timeout: probe.timeout,
                },
                ip,
            )
            .await
        }
        Method::Exec(command) => {
            let run = tokio::process::Command::new(&command[0])
                .args(&command[1..])
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .kill_on_drop(true)
                .status();
            match tokio::time::timeout(probe.timeout, run).await {
                Err(_) => Err(format!(
                    "command timeout exceeded: {:?} after {:?}",
                    command, probe.timeout
                )),
                Ok(Err(e)) => Err(format!("command {:?}: {e}", command[0])),
                Ok(Ok(s)) if s.success() => Ok(()),
                Ok(Ok(s)) => Err(format!("command {:?} exited with {s}", command)),
            }
        }
    }
}

/// Runs the checker until the process ends: after `initial_delay`, every `period`, Envoy's
/// readiness (`envoy_ready`) and then the probe; each change of verdict is published on `tx`.
pub async fn run<F, Fut>(
    probe: HealthProbe,
    default_host: IpAddr,
    envoy_ready: F,
    tx: watch::Sender<Option<Health>>,
) where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<(), String>>,
{
    tokio::time::sleep(probe.initial_delay).await;
    let mut judge = Judge::new(&probe);
    let mut tick = tokio::time::interval(probe.period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let outcome = match envoy_ready().await {
            Ok(()) => probe_once(&probe, default_host).await,
            Err(why) => Err(why),
        };
        if let Some(verdict) = judge.observe(outcome) {
            match &verdict {
                Health::Healthy => tracing::info!("health check passed: reporting healthy"),
                Health::Unhealthy(why) => {
                    tracing::warn!(reason = %why, "health check failed: reporting unhealthy")
                }
            }
            tx.send_replace(Some(verdict));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::probes::Check;
    use std::time::Duration;

    fn probe(method: Method, success: u32, failure: u32) -> HealthProbe {
        HealthProbe {
            initial_delay: Duration::ZERO,
            timeout: Duration::from_secs(1),
            period: Duration::from_millis(20),
            success_threshold: success,
            failure_threshold: failure,
            method,
        }
    }

    #[test]
    fn verdicts_come_on_thresholds_and_changes_only() {
        let mut j = Judge::new(&probe(Method::Exec(vec!["x".into()]), 2, 3));
        let fail = || Err("down".to_string());
        assert_eq!(j.observe(Ok(())), None);
        assert_eq!(j.observe(Ok(())), Some(Health::Healthy));
        assert_eq!(j.observe(Ok(())), None);
        assert_eq!(j.observe(Ok(())), None, "no repeat of an unchanged verdict");
        assert_eq!(j.observe(fail()), None);
        assert_eq!(j.observe(fail()), None);
        assert_eq!(j.observe(fail()), Some(Health::Unhealthy("down".into())));
        assert_eq!(j.observe(fail()), None);
        assert_eq!(j.observe(Ok(())), None);
        assert_eq!(j.observe(fail()), None, "a pass resets the failures");
        assert_eq!(j.observe(Ok(())), None);
        assert_eq!(j.observe(Ok(())), Some(Health::Healthy));
    }

    #[test]
    fn reports_are_istios_requests() {
        use envoy_types::pb::envoy::service::discovery::v3::{
            DeltaDiscoveryRequest, DiscoveryRequest,
        };
        let healthy = DiscoveryRequest::decode(request(false, &Health::Healthy)).unwrap();
        assert_eq!(healthy.type_url, HEALTH_INFO_TYPE);
        assert!(healthy.error_detail.is_none() && healthy.node.is_none());
        assert!(healthy.response_nonce.is_empty() && healthy.resource_names.is_empty());
        let sick =
            DeltaDiscoveryRequest::decode(request(true, &Health::Unhealthy("no".into()))).unwrap();
        assert_eq!(sick.type_url, HEALTH_INFO_TYPE);
        let detail = sick.error_detail.unwrap();
        assert_eq!((detail.code, detail.message.as_str()), (13, "no"));
    }

    #[tokio::test]
    async fn the_checker_follows_the_app_and_envoy() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let p = probe(
            Method::Check {
                check: Check::Tcp { port },
                host: None,
            },
            1,
            1,
        );
        let (tx, mut rx) = watch::channel(None);
        let envoy = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let e = envoy.clone();
        let task = tokio::spawn(run(
            p,
            IpAddr::from([127, 0, 0, 1]),
            move || {
                let ready = e.load(std::sync::atomic::Ordering::SeqCst);
                async move {
                    if ready {
                        Ok(())
                    } else {
                        Err("Envoy not ready".to_string())
                    }
                }
            },
            tx,
        ));
        let next = |rx: &mut HealthWatch| {
            let mut rx = rx.clone();
            async move {
                tokio::time::timeout(Duration::from_secs(5), rx.changed())
                    .await
                    .unwrap()
                    .unwrap();
                rx.borrow_and_update().clone()
            }
        };
        assert_eq!(
            next(&mut rx).await,
            Some(Health::Unhealthy("Envoy not ready".into()))
        );
        rx.borrow_and_update();
        envoy.store(true, std::sync::atomic::Ordering::SeqCst);
        assert_eq!(next(&mut rx).await, Some(Health::Healthy));
        rx.borrow_and_update();
        drop(listener);
        let down = next(&mut rx).await;
        assert!(
            matches!(&down, Some(Health::Unhealthy(why)) if why.contains("connect")),
            "{down:?}"
        );
        task.abort();
    }

    #[tokio::test]
    async fn exec_probes_run_the_command_with_its_timeout() {
        let ok = probe(Method::Exec(vec!["/bin/true".into()]), 1, 1);
        assert_eq!(probe_once(&ok, IpAddr::from([127, 0, 0, 1])).await, Ok(()));
        let bad = probe(Method::Exec(vec!["/bin/false".into()]), 1, 1);
        assert!(
            probe_once(&bad, IpAddr::from([127, 0, 0, 1]))
                .await
                .is_err()
        );
        let mut slow = probe(Method::Exec(vec!["/bin/sleep".into(), "5".into()]), 1, 1);
        slow.timeout = Duration::from_millis(100);
        let e = probe_once(&slow, IpAddr::from([127, 0, 0, 1]))
            .await
            .unwrap_err();
        assert!(e.contains("timeout"), "{e}");
    }
}
