#![allow(clippy::unwrap_used)] // test code: a panic is the failure report
//! pilot-agent refuses a config whose ports collide (or are 0) and a boolean env var that is not
//! one of Go's `strconv.ParseBool` spellings: it exits non-zero, naming the input, before it
//! writes the bootstrap or starts Envoy. The Envoy it is given is a script that leaves a mark, so
//! "Envoy never ran" is observed, not inferred; a valid config run the same way shows the mark
//! appears. Needs neither root nor Envoy (only the built `pilot-agent`).

use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use harness::binary;

/// A scratch directory, removed on drop; world-writable because as root the agent runs Envoy as
/// the proxy's uid, which must be able to leave its mark.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("failfast-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("mesh")).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// What a run of the agent left.
struct Run {
    code: Option<i32>,
    stderr: String,
    envoy_ran: bool,
    /// The agent made configPath (where the bootstrap goes) just before it starts Envoy.
    config_dir_made: bool,
}

/// Ports nothing listens on now, for the status and admin ports of runs that get that far.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Runs `pilot-agent proxy sidecar` in a scratch directory with the embedded control plane, the
/// fake Envoy and `proxy_config` (JSON object fields) plus `env`; waits at most 60 s.
fn run_agent(name: &str, proxy_config: serde_json::Value, env: &[(&str, &str)]) -> Run {
    let scratch = Scratch::new(name);
    let dir = &scratch.0;
    let mark = dir.join("envoy-ran");
    let fake = dir.join("fake-envoy");
    std::fs::write(
        &fake,
        // `--version` is the real Envoy's: the agent checks the build before it starts Envoy.
        format!(
            "#!/bin/sh\nif [ \"$1\" = --version ]; then exec '{}' --version; fi\ntouch '{}'\nexit 3\n",
            harness::envoy_path(),
            mark.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let config_path = dir.join("proxy");
    let mut pc = serde_json::json!({
        "binaryPath": fake,
        "configPath": config_path,
        "terminationDrainDuration": "1s",
    });
    for (k, v) in proxy_config.as_object().unwrap() {
        pc[k] = v.clone();
    }
    let mut child = Command::new(binary("pilot-agent"))
        .args(["proxy", "sidecar", "--configDir"])
        .arg(dir.join("mesh"))
        .current_dir(dir)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("PROXY_CONFIG", pc.to_string())
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("stderr")).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    Run {
        code: status.and_then(|s| s.code()),
        stderr: std::fs::read_to_string(dir.join("stderr")).unwrap_or_default(),
        envoy_ran: exists(&mark),
        config_dir_made: exists(&config_path),
    }
}

fn exists(path: &Path) -> bool {
    path.try_exists().unwrap_or(false)
}

/// One refused config: its ProxyConfig fields, its env, and what stderr must name.
struct Case {
    name: &'static str,
    proxy_config: serde_json::Value,
    env: &'static [(&'static str, &'static str)],
    names: &'static [&'static str],
}

#[test]
fn a_port_collision_or_a_bad_boolean_exits_before_envoy_starts() {
    let (status, admin) = (free_port(), free_port());
    let ports = serde_json::json!({ "statusPort": status, "proxyAdminPort": admin });
    let cases = [
        Case {
            name: "admin-on-status",
            proxy_config: serde_json::json!({ "proxyAdminPort": 15020 }),
            env: &[],
            names: &["env PROXY_CONFIG proxyAdminPort", "15020", "statusPort"],
        },
        Case {
            name: "admin-on-outbound",
            proxy_config: serde_json::json!({ "statusPort": status, "proxyAdminPort": 15001 }),
            env: &[],
            names: &["proxyAdminPort", "15001", "virtualOutbound"],
        },
        Case {
            name: "status-zero",
            proxy_config: serde_json::json!({ "statusPort": 0, "proxyAdminPort": admin }),
            env: &[],
            names: &["env PROXY_CONFIG statusPort", "\"0\""],
        },
        Case {
            name: "dns-on-readiness",
            proxy_config: ports.clone(),
            env: &[
                ("ISTIO_META_DNS_CAPTURE", "true"),
                ("DNS_PROXY_ADDR", "127.0.0.1:15021"),
            ],
            names: &["DNS_PROXY_ADDR", "15021", "readiness"],
        },
        Case {
            name: "dns-capture-yes",
            proxy_config: ports.clone(),
            env: &[("ISTIO_META_DNS_CAPTURE", "yes")],
            names: &[
                "ISTIO_META_DNS_CAPTURE",
                "\"yes\"",
                "1, t, T, TRUE, true, True",
            ],
        },
        Case {
            name: "exit-on-zero-on",
            proxy_config: ports.clone(),
            env: &[("EXIT_ON_ZERO_ACTIVE_CONNECTIONS", "on")],
            names: &["EXIT_ON_ZERO_ACTIVE_CONNECTIONS", "\"on\""],
        },
    ];
    for Case {
        name: case,
        proxy_config,
        env,
        names,
    } in cases
    {
        let run = run_agent(case, proxy_config, env);
        assert_eq!(run.code, Some(255), "{case}: {}", run.stderr);
        for name in names {
            assert!(
                run.stderr.contains(name),
                "{case}: no {name:?} in {}",
                run.stderr
            );
        }
        assert!(!run.envoy_ran, "{case}: Envoy was started\n{}", run.stderr);
        assert!(
            !run.config_dir_made,
            "{case}: configPath made\n{}",
            run.stderr
        );
    }

    // The control: the same run with a valid config does start the (fake) Envoy, whose exit
    // then takes the agent down.
    let run = run_agent("valid", ports, &[("ISTIO_META_DNS_CAPTURE", "False")]);
    assert!(run.envoy_ran, "the fake Envoy never ran\n{}", run.stderr);
    assert!(run.config_dir_made, "{}", run.stderr);
    assert_ne!(run.code, Some(0), "{}", run.stderr);
}
