//! What of a pod spec this kubelet does, refuses (an error naming the field) or accepts without
//! enforcing (named in a Warning Event).

use anyhow::{Context, Result, bail};

use k8s_openapi::api::core::v1::Pod;

use super::*;

/// Rejects what this kubelet cannot do (naming the field); returns what it accepts without
/// enforcing.
pub(super) fn check_spec(pod: &Pod) -> Result<Vec<String>> {
    let spec = pod.spec.as_ref().context("pod without spec")?;
    let mut lax = Vec::new();
    if spec.host_network == Some(true) {
        bail!("spec.hostNetwork: host-network pods are not supported by this kubelet");
    }
    if spec.host_pid == Some(true) || spec.host_ipc == Some(true) {
        bail!("spec.hostPID/hostIPC: not supported by this kubelet");
    }
    if let Some(sc) = &spec.security_context {
        for (i, s) in sc.sysctls.iter().flatten().enumerate() {
            if !s.name.starts_with("net.") {
                bail!(
                    "spec.securityContext.sysctls[{i}] ({}): only net.* sysctls (per network namespace) are supported",
                    s.name
                );
            }
        }
        if sc.seccomp_profile.is_some() {
            lax.push("spec.securityContext.seccompProfile".to_string());
        }
    }
    let all = spec
        .init_containers
        .iter()
        .flatten()
        .enumerate()
        .map(|(i, c)| (format!("spec.initContainers[{i}]"), c))
        .chain(
            spec.containers
                .iter()
                .enumerate()
                .map(|(i, c)| (format!("spec.containers[{i}]"), c)),
        );
    for (field, c) in all {
        images::resolve(c.image.as_deref().unwrap_or_default())
            .with_context(|| format!("{field}.image"))?;
        for (j, p) in c.ports.iter().flatten().enumerate() {
            if p.host_port.is_some_and(|h| h != 0) {
                bail!("{field}.ports[{j}].hostPort: not supported by this kubelet");
            }
        }
        if let Some(sc) = &c.security_context {
            if sc.read_only_root_filesystem == Some(true) {
                lax.push(format!("{field}.securityContext.readOnlyRootFilesystem"));
            }
            if sc.seccomp_profile.is_some() {
                lax.push(format!("{field}.securityContext.seccompProfile"));
            }
            if sc.se_linux_options.is_some()
                || sc.app_armor_profile.is_some()
                || sc.windows_options.is_some()
            {
                bail!(
                    "{field}.securityContext: seLinuxOptions, appArmorProfile and windowsOptions are not supported by this kubelet"
                );
            }
        }
        if c.resources
            .as_ref()
            .is_some_and(|r| r.limits.is_some() || r.requests.is_some())
        {
            lax.push(format!("{field}.resources"));
        }
        for (what, p) in [
            ("startupProbe", &c.startup_probe),
            ("readinessProbe", &c.readiness_probe),
            ("livenessProbe", &c.liveness_probe),
        ] {
            if let Some(p) = p {
                if p.grpc.is_some() {
                    bail!("{field}.{what}.grpc: not supported by this kubelet");
                }
                if p.http_get
                    .as_ref()
                    .is_some_and(|h| h.scheme.as_deref() == Some("HTTPS"))
                {
                    bail!(
                        "{field}.{what}.httpGet.scheme: HTTPS probes are not supported by this kubelet"
                    );
                }
            }
        }
        if let Some(l) = &c.lifecycle {
            for (what, h) in [("postStart", &l.post_start), ("preStop", &l.pre_stop)] {
                if let Some(h) = h
                    && h.exec.is_none()
                    && h.sleep.is_none()
                    && h.http_get.is_none()
                {
                    bail!(
                        "{field}.lifecycle.{what}: only exec, httpGet and sleep handlers are supported"
                    );
                }
            }
        }
    }
    Ok(lax)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code: a panic is the failure report
    use super::*;

    fn pod(spec: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({"metadata": {"name": "p"}, "spec": spec}))
            .unwrap()
    }

    const PROXY: &str = "localhost/istio-rs/proxyv2:test";

    #[test]
    fn what_it_cannot_do_is_refused_by_field() {
        let cases = [
            (
                serde_json::json!({"containers": [{"name": "c", "image": PROXY}], "hostNetwork": true}),
                "spec.hostNetwork",
            ),
            (
                serde_json::json!({"containers": [{"name": "c", "image": "nginx"}]}),
                "spec.containers[0].image",
            ),
            (
                serde_json::json!({"containers": [{"name": "c", "image": PROXY, "ports": [{"containerPort": 80, "hostPort": 80}]}]}),
                "spec.containers[0].ports[0].hostPort",
            ),
            (
                serde_json::json!({"initContainers": [{"name": "i", "image": PROXY, "readinessProbe": {"grpc": {"port": 1}}}], "containers": []}),
                "spec.initContainers[0].readinessProbe.grpc",
            ),
            (
                serde_json::json!({"containers": [], "securityContext": {"sysctls": [{"name": "kernel.shm_rmid_forced", "value": "1"}]}}),
                "spec.securityContext.sysctls[0]",
            ),
        ];
        for (spec, field) in cases {
            let err = check_spec(&pod(spec.clone())).unwrap_err().to_string();
            assert!(err.contains(field), "{spec}: {err}");
        }
    }

    #[test]
    fn what_it_does_not_enforce_is_named() {
        let lax = check_spec(&pod(serde_json::json!({
            "containers": [{
                "name": "c", "image": PROXY,
                "resources": {"limits": {"cpu": "2"}},
                "securityContext": {"readOnlyRootFilesystem": true},
            }],
            "securityContext": {"sysctls": [{"name": "net.ipv4.ip_unprivileged_port_start", "value": "0"}]},
        })))
        .unwrap();
        assert_eq!(
            lax,
            [
                "spec.containers[0].securityContext.readOnlyRootFilesystem",
                "spec.containers[0].resources"
            ]
        );
    }
}
