//! DNS auto-allocation: addresses of their own for ServiceEntry hosts that have none, as Istio's
//! IP allocation controller gives them (`pilot/pkg/controllers/ipallocate`, on by default since
//! 1.25, `PILOT_ENABLE_IP_AUTOALLOCATE`): one IPv4 from 240.240.0.0/16 and one IPv6 from
//! 2001:2::/48 per host, handed out in order from the start of each range (240.240.0.1,
//! 2001:2::1, ...), skipping every address in use (another host's, or a ServiceEntry's own
//! `addresses` inside the ranges).
//!
//! An address stays with its host (namespace and hostname): the one the ServiceEntry's
//! `status.addresses` records for it (in Kubernetes, written by `kube::ip_allocate`, so it holds
//! across restarts and replicas), else the one it had in the previous snapshot. The next one
//! handed out continues after the last, so an address freed by a deleted entry is not given to
//! another at once (an app may still hold it from DNS). New hosts of one snapshot are served in
//! (namespace, hostname) order; of two hosts claiming one address, the first in that order
//! keeps it.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::model::Service;

/// 240.240.0.0/16.
const V4_BASE: u32 = u32::from_be_bytes([240, 240, 0, 0]);
const V4_SIZE: u32 = 1 << 16;
/// 2001:2::/48.
const V6_BASE: u128 = 0x2001_0002_0000_0000_0000_0000_0000_0000;
const V6_SIZE: u128 = 1 << 80;

/// Where the next allocation starts in each range (offsets from its base).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cursor {
    v4: u32,
    v6: u128,
}

impl Default for Cursor {
    fn default() -> Self {
        Cursor { v4: 1, v6: 1 }
    }
}

fn in_v4(a: &IpAddr) -> Option<u32> {
    match a {
        IpAddr::V4(v4) => u32::from(*v4).checked_sub(V4_BASE).filter(|o| *o < V4_SIZE),
        IpAddr::V6(_) => None,
    }
}

fn in_v6(a: &IpAddr) -> Option<u128> {
    match a {
        IpAddr::V6(v6) => u128::from(*v6)
            .checked_sub(V6_BASE)
            .filter(|o| *o < V6_SIZE),
        IpAddr::V4(_) => None,
    }
}

/// The next free offset from `start` (wrapping to 1 once), or None when the range is full.
fn next_free<T: Copy + Ord + std::ops::Add<Output = T> + From<u8>>(
    start: T,
    size: T,
    used: &BTreeSet<T>,
) -> Option<T> {
    let one = T::from(1u8);
    let mut n = if start >= size { one } else { start };
    let mut wrapped = start >= size;
    while used.contains(&n) {
        n = n + one;
        if n >= size {
            if wrapped {
                return None;
            }
            wrapped = true;
            n = one;
        }
    }
    Some(n)
}

/// Gives every allocatable service of `services` its addresses: those it had in `previous`
/// (when no service claims them as its own now), else new ones from `cursor`; returns the
/// cursor to carry to the next snapshot. Nothing is given when `enabled` is false.
pub fn allocate(
    services: &mut [Service],
    previous: Option<&[Service]>,
    cursor: Cursor,
    enabled: bool,
) -> Cursor {
    if !enabled {
        return cursor;
    }
    let key = |s: &Service| (s.namespace.clone(), s.hostname.clone());
    let kept: BTreeMap<(String, String), Vec<IpAddr>> = previous
        .unwrap_or_default()
        .iter()
        .filter(|s| !s.auto_addresses.is_empty())
        .map(|s| (key(s), s.auto_addresses.clone()))
        .collect();
    // What services hold as their own.
    let own: BTreeSet<IpAddr> = services
        .iter()
        .flat_map(|s| s.addresses.iter().copied())
        .collect();
    let mut used4: BTreeSet<u32> = own.iter().filter_map(in_v4).collect();
    let mut used6: BTreeSet<u128> = own.iter().filter_map(in_v6).collect();
    let mut order: Vec<usize> = (0..services.len())
        .filter(|i| services[*i].allocatable)
        .collect();
    order.sort_by_key(|i| key(&services[*i]));
    // Kept addresses first, so new hosts never take one of them: what the entry's status
    // says (the controller's record, shared by every replica), else what the host had; one
    // taken already (by an entry's own addresses or an earlier host) is not kept.
    let mut fresh = Vec::new();
    for i in order {
        let claim = Some(&services[i].claimed_addresses)
            .filter(|c| !c.is_empty())
            .or_else(|| kept.get(&key(&services[i])))
            .cloned();
        let free = |a: &IpAddr| {
            !own.contains(a)
                && in_v4(a).is_none_or(|o| !used4.contains(&o))
                && in_v6(a).is_none_or(|o| !used6.contains(&o))
        };
        match claim.filter(|addrs| addrs.iter().all(free)) {
            Some(addrs) => {
                for a in &addrs {
                    if let Some(o) = in_v4(a) {
                        used4.insert(o);
                    }
                    if let Some(o) = in_v6(a) {
                        used6.insert(o);
                    }
                }
                services[i].auto_addresses = addrs;
            }
            None => fresh.push(i),
        }
    }
    let mut cursor = cursor;
    for i in fresh {
        let mut addrs = Vec::new();
        if let Some(o) = next_free(cursor.v4, V4_SIZE, &used4) {
            used4.insert(o);
            cursor.v4 = o + 1;
            addrs.push(IpAddr::V4(Ipv4Addr::from(V4_BASE + o)));
        } else {
            tracing::error!(host = %services[i].hostname, "240.240.0.0/16 is exhausted: no IPv4 address allocated");
        }
        if let Some(o) = next_free(cursor.v6, V6_SIZE, &used6) {
            used6.insert(o);
            cursor.v6 = o + 1;
            addrs.push(IpAddr::V6(Ipv6Addr::from(V6_BASE + o)));
        }
        services[i].auto_addresses = addrs;
    }
    cursor
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(ns: &str, host: &str, addresses: &[&str]) -> Service {
        Service {
            hostname: host.into(),
            namespace: ns.into(),
            addresses: addresses.iter().map(|a| a.parse().unwrap()).collect(),
            allocatable: addresses.is_empty(),
            ..Default::default()
        }
    }

    fn given(services: &[Service]) -> Vec<(String, Vec<String>)> {
        services
            .iter()
            .map(|s| {
                (
                    s.hostname.clone(),
                    s.auto_addresses.iter().map(ToString::to_string).collect(),
                )
            })
            .collect()
    }

    /// The DNS-proxy docs' two address-less TCP entries get distinct addresses, in host order,
    /// from the start of both ranges; an entry with addresses gets none, and its address in
    /// the range is skipped.
    #[test]
    fn hosts_get_addresses_in_order_from_the_start_of_the_ranges() {
        let mut s = vec![
            svc("default", "tcp-echo.external-2.svc.cluster.local", &[]),
            svc("default", "tcp-echo.external-1.svc.cluster.local", &[]),
            svc("default", "own.example.com", &["240.240.0.2"]),
        ];
        let cursor = allocate(&mut s, None, Cursor::default(), true);
        assert_eq!(
            given(&s),
            [
                (
                    "tcp-echo.external-2.svc.cluster.local".to_string(),
                    vec!["240.240.0.3".to_string(), "2001:2::2".to_string()]
                ),
                (
                    "tcp-echo.external-1.svc.cluster.local".to_string(),
                    vec!["240.240.0.1".to_string(), "2001:2::1".to_string()]
                ),
                ("own.example.com".to_string(), vec![]),
            ]
        );
        assert_eq!(cursor, Cursor { v4: 4, v6: 3 });
        // Off: nothing.
        let mut off = vec![svc("default", "a.example.com", &[])];
        allocate(&mut off, None, Cursor::default(), false);
        assert!(off[0].auto_addresses.is_empty());
    }

    /// Addresses stay with their hosts across snapshots; a new host continues after the last
    /// handed out, even when an earlier one was freed; an entry that now claims a host's
    /// address as its own moves that host.
    #[test]
    fn addresses_stay_with_their_hosts() {
        let mut first = vec![
            svc("ns", "a.example.com", &[]),
            svc("ns", "b.example.com", &[]),
        ];
        let cursor = allocate(&mut first, None, Cursor::default(), true);
        // a is deleted, c is new (before b by name).
        let mut second = vec![
            svc("ns", "b.example.com", &[]),
            svc("ns", "c.example.com", &[]),
        ];
        let cursor = allocate(&mut second, Some(&first), cursor, true);
        assert_eq!(second[0].auto_addresses, first[1].auto_addresses);
        assert_eq!(second[1].auto_addresses[0].to_string(), "240.240.0.3");
        // d claims b's address as its own: b moves.
        let mut third = vec![
            svc("ns", "b.example.com", &[]),
            svc("ns", "c.example.com", &[]),
            svc("ns", "d.example.com", &["240.240.0.2"]),
        ];
        allocate(&mut third, Some(&second), cursor, true);
        assert_eq!(third[0].auto_addresses[0].to_string(), "240.240.0.4");
        assert_eq!(third[1].auto_addresses, second[1].auto_addresses);
    }

    /// What a ServiceEntry's status records is kept over what the last snapshot had (another
    /// replica's record, or this one's before a restart); of two hosts claiming one address,
    /// the first keeps it and the other gets a new one.
    #[test]
    fn the_status_record_is_kept() {
        let claim = |mut s: Service, a: &[&str]| {
            s.claimed_addresses = a.iter().map(|a| a.parse().unwrap()).collect();
            s
        };
        let mut s = vec![
            claim(
                svc("ns", "a.example.com", &[]),
                &["240.240.0.7", "2001:2::7"],
            ),
            claim(
                svc("ns", "b.example.com", &[]),
                &["240.240.0.7", "2001:2::9"],
            ),
            svc("ns", "c.example.com", &[]),
        ];
        let cursor = allocate(&mut s, None, Cursor::default(), true);
        assert_eq!(
            given(&s)
                .into_iter()
                .map(|(_, a)| a.join(" "))
                .collect::<Vec<_>>(),
            [
                "240.240.0.7 2001:2::7",
                "240.240.0.1 2001:2::1",
                "240.240.0.2 2001:2::2"
            ]
        );
        assert_eq!(cursor, Cursor { v4: 3, v6: 3 });
    }

    #[test]
    fn a_full_range_wraps_then_gives_up() {
        let used: BTreeSet<u32> = (1..V4_SIZE).collect();
        assert_eq!(next_free(5, V4_SIZE, &used), None);
        let used: BTreeSet<u32> = (2..V4_SIZE).collect();
        assert_eq!(next_free(V4_SIZE, V4_SIZE, &used), Some(1));
    }
}
