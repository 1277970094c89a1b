//! Warns when the application runs as the proxy's uid. istio-iptables never captures traffic
//! from the proxy's uid (1337), so such an app talks past Envoy: no mTLS, no policy, no
//! telemetry (Istio documents this as a requirement, "Application UIDs", and checks nothing).
//!
//! The agent cannot read another container's user, but it shares the pod's network namespace:
//! `/proc/net/tcp{,6}` gives each socket's owner. A socket listening on one of the pod's
//! declared container ports (`ISTIO_META_POD_PORTS`, which Istio's injector sets) and owned by
//! the proxy's uid is the application, running as the proxy's uid. An app that declares no
//! port, or only connects out, is not seen.

use std::collections::BTreeSet;
use std::time::Duration;

/// The metadata key (`ISTIO_META_` stripped) of the pod's declared container ports.
pub const POD_PORTS: &str = "POD_PORTS";

/// How often, and for how long after start, the sockets are looked at: the app usually starts
/// after the proxy (native sidecars, `holdApplicationUntilProxyStarts`).
const EVERY: Duration = Duration::from_secs(5);
const FOR: Duration = Duration::from_secs(600);

/// The TCP ports of `ISTIO_META_POD_PORTS` (`[{"containerPort":8080,"protocol":"TCP"},...]`).
pub fn declared_ports(pod_ports_json: &str) -> BTreeSet<u16> {
    let Ok(serde_json::Value::Array(ports)) = serde_json::from_str(pod_ports_json) else {
        return BTreeSet::new();
    };
    ports
        .iter()
        .filter(|p| {
            p.get("protocol")
                .and_then(|v| v.as_str())
                .is_none_or(|proto| proto.eq_ignore_ascii_case("TCP"))
        })
        .filter_map(|p| p.get("containerPort")?.as_u64())
        .filter_map(|p| u16::try_from(p).ok())
        .collect()
}

/// (port, owner uid) of each listening socket in a `/proc/net/tcp` or `tcp6` table.
pub fn listeners(table: &str) -> Vec<(u16, u32)> {
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            // sl, local_address, rem_address, st, tx:rx queue, tr:when, retrnsmt, uid, ...
            if f.get(3) != Some(&"0A") {
                return None;
            }
            let port = u16::from_str_radix(f.get(1)?.rsplit(':').next()?, 16).ok()?;
            let uid = f.get(7)?.parse().ok()?;
            Some((port, uid))
        })
        .collect()
}

/// The declared ports that a socket owned by `proxy_uid` listens on.
pub fn served_as_proxy(
    declared: &BTreeSet<u16>,
    listening: &[(u16, u32)],
    proxy_uid: u32,
) -> BTreeSet<u16> {
    listening
        .iter()
        .filter(|(port, uid)| *uid == proxy_uid && declared.contains(port))
        .map(|(port, _)| *port)
        .collect()
}

fn read_listeners() -> Vec<(u16, u32)> {
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|f| std::fs::read_to_string(f).ok())
        .flat_map(|t| listeners(&t))
        .collect()
}

/// Looks at the pod's sockets every few seconds for the first minutes and logs one warning per
/// declared port the application serves as `proxy_uid`. Returns at once without declared ports.
pub async fn watch(pod_ports_json: Option<String>, proxy_uid: u32) {
    let declared = declared_ports(pod_ports_json.as_deref().unwrap_or_default());
    if declared.is_empty() {
        return;
    }
    let mut warned = BTreeSet::new();
    let deadline = tokio::time::Instant::now() + FOR;
    while tokio::time::Instant::now() < deadline && warned.len() < declared.len() {
        for port in served_as_proxy(&declared, &read_listeners(), proxy_uid) {
            if warned.insert(port) {
                tracing::warn!(
                    port,
                    uid = proxy_uid,
                    "the application listens on its port {port} as uid {proxy_uid}, the proxy's \
                     uid: traffic from the proxy's uid is never captured, so this application's \
                     outbound traffic bypasses Envoy (no mTLS, policy or telemetry); run it as \
                     another uid"
                );
            }
        }
        tokio::time::sleep(EVERY).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `/proc/net/tcp` excerpt: 0.0.0.0:8080 listening as 1337, 0.0.0.0:9090 as 1000,
    /// 127.0.0.1:15000 (Envoy's admin) as 1337, and an established connection from 8080.
    const TCP: &str = "\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1337        0 1001 1 0 100 0 0 10 0
   1: 00000000:2382 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 1002 1 0 100 0 0 10 0
   2: 0100007F:3A98 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1337        0 1003 1 0 100 0 0 10 0
   3: 0200E90A:1F90 0300E90A:C350 01 00000000:00000000 00:00000000 00000000  1337        0 1004 1 0 20 4 30 10 -1
";

    #[test]
    fn reads_listening_sockets_and_their_owners() {
        assert_eq!(listeners(TCP), [(8080, 1337), (9090, 1000), (15000, 1337)]);
    }

    #[test]
    fn a_declared_port_served_as_the_proxy_uid_is_reported() {
        let declared = declared_ports(
            r#"[{"name":"http","containerPort":8080,"protocol":"TCP"},
                {"name":"metrics","containerPort":9090},
                {"name":"dns","containerPort":5353,"protocol":"UDP"}]"#,
        );
        assert_eq!(declared, BTreeSet::from([8080, 9090]));
        let listening = listeners(TCP);
        assert_eq!(
            served_as_proxy(&declared, &listening, 1337),
            BTreeSet::from([8080])
        );
        // Envoy's own ports are not declared; an app as another uid is fine.
        assert!(served_as_proxy(&declared, &listening, 1000) == BTreeSet::from([9090]));
        assert!(served_as_proxy(&BTreeSet::from([15000]), &[(15000, 1000)], 1337).is_empty());
    }

    #[test]
    fn no_or_bad_declaration_is_no_port() {
        assert!(declared_ports("").is_empty());
        assert!(declared_ports("not json").is_empty());
        assert!(declared_ports(r#"[{"containerPort":70000}]"#).is_empty());
    }
}
