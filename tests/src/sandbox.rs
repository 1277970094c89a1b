//! A pod's network sandbox, the one place that knows how a pod becomes a network namespace: the
//! namespace, a veth pair whose outer end joins a bridge, the pod's addresses and routes, its
//! sysctls and its `/etc` files (bind-mounted by `ip netns exec` from `/etc/netns/NAME`). The
//! end-to-end tests' pods (`Network`) and the test kubelet's pods are both made here. Every
//! command takes an argument vector; nothing a pod spec says goes through a shell.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

/// Where the bridge is: its namespace (`None`: the caller's) and its name.
#[derive(Debug, Clone, Copy)]
pub struct Bridge<'a> {
    pub netns: Option<&'a str>,
    pub name: &'a str,
}

/// A route of the pod: to `dest` (a CIDR or `default`), through `via` or straight out of eth0.
#[derive(Debug, Clone, Copy)]
pub struct Route<'a> {
    pub dest: &'a str,
    pub via: Option<&'a str>,
}

/// What a sandbox is made of.
#[derive(Debug, Clone, Copy)]
pub struct Spec<'a> {
    /// The network namespace's name (under /var/run/netns).
    pub netns: &'a str,
    pub bridge: Bridge<'a>,
    /// The name of the veth end that stays on the bridge's side (the pod's end is `eth0`).
    pub link: &'a str,
    /// The pod's addresses with their prefix (`10.0.0.2/24`, `fd00::2/64`).
    pub addresses: &'a [String],
    pub routes: &'a [Route<'a>],
}

/// `ip ARGS`, failing with the command and its stderr.
fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .context("run ip (iproute2)")?;
    if !out.status.success() {
        bail!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Makes the sandbox: the namespace, the veth pair on the bridge, loopback and eth0 up with
/// the addresses (IPv6 without duplicate address detection, so it is usable at once), then the
/// routes. On an error the namespace is removed again.
pub fn create(spec: &Spec) -> Result<()> {
    let ns = spec.netns;
    ip(&["netns", "add", ns])?;
    let made = (|| {
        let mut on_bridge: Vec<&str> = Vec::new();
        if let Some(bridge_ns) = spec.bridge.netns {
            on_bridge.extend(["-n", bridge_ns]);
        }
        let add = [
            "link", "add", spec.link, "type", "veth", "peer", "name", "eth0", "netns", ns,
        ];
        ip(&[on_bridge.as_slice(), &add].concat())?;
        let attach = ["link", "set", spec.link, "master", spec.bridge.name, "up"];
        ip(&[on_bridge.as_slice(), &attach].concat())?;
        ip(&["-n", ns, "link", "set", "lo", "up"])?;
        for a in spec.addresses {
            if a.contains(':') {
                ip(&["-n", ns, "-6", "addr", "add", a, "dev", "eth0", "nodad"])?;
            } else {
                ip(&["-n", ns, "addr", "add", a, "dev", "eth0"])?;
            }
        }
        ip(&["-n", ns, "link", "set", "eth0", "up"])?;
        for r in spec.routes {
            match r.via {
                Some(gateway) => ip(&["-n", ns, "route", "add", r.dest, "via", gateway])?,
                None => ip(&["-n", ns, "route", "add", r.dest, "dev", "eth0"])?,
            }
        }
        Ok(())
    })();
    if made.is_err() {
        remove(ns);
    }
    made
}

/// Sets sysctl `name` (dotted, `net.ipv4.ip_unprivileged_port_start`) to `value` inside the
/// namespace: a thread joins it and writes `/proc/sys/...`, which resolves `net.*` in the
/// writer's namespace. Only `net.*` sysctls are per network namespace; others are refused.
pub fn set_sysctl(netns: &str, name: &str, value: &str) -> Result<()> {
    if !name.starts_with("net.") || name.contains('/') || name.split('.').any(str::is_empty) {
        bail!("sysctl {name:?}: only net.* sysctls (per network namespace) can be set in a pod");
    }
    let path = PathBuf::from("/proc/sys").join(name.replace('.', "/"));
    let file = fs::File::open(Path::new("/var/run/netns").join(netns))
        .with_context(|| format!("open network namespace {netns}"))?;
    let value = value.to_string();
    std::thread::scope(|s| {
        s.spawn(|| -> Result<()> {
            nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
                .with_context(|| format!("join network namespace {netns}"))?;
            fs::write(&path, format!("{value}\n")).with_context(|| format!("sysctl {name}={value}"))
        })
        .join()
        .unwrap_or_else(|_| bail!("sysctl {name}: the writing thread panicked"))
    })
}

/// Puts `contents` at `/etc/REL` as the pod's processes see it. `ip netns exec` bind-mounts each
/// entry of /etc/netns/NS over /etc, which needs the mount point (`/etc/<first part of REL>`) to
/// exist on the host; an empty directory is made for it when missing.
pub fn write_etc(netns: &str, rel: &str, contents: &[u8]) -> Result<()> {
    let top = rel.split('/').next().unwrap_or(rel);
    if rel.contains('/') && !Path::new("/etc").join(top).exists() {
        fs::create_dir_all(Path::new("/etc").join(top))?;
    }
    let path = Path::new("/etc/netns").join(netns).join(rel);
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent)?;
    }
    fs::write(&path, contents).with_context(|| format!("write {}", path.display()))
}

/// The path of the pod's `/etc/REL` on the host.
pub fn etc_path(netns: &str, rel: &str) -> PathBuf {
    Path::new("/etc/netns").join(netns).join(rel)
}

/// Deletes the namespace (and the veth pair with it) and the pod's /etc files.
pub fn remove(netns: &str) {
    let _ = fs::remove_dir_all(Path::new("/etc/netns").join(netns));
    let _ = Command::new("ip").args(["netns", "delete", netns]).status();
}
