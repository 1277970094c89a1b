//! Connection slots for a listener that peers can reach: the one admission rule of the agent's side
//! port, its DNS proxy's TCP side and istiod-core's xDS port.
//!
//! A connection is either *busy* (a request is being served, or, for a long-lived protocol, it has
//! finished its handshake) or *unfinished* (it has not sent a whole request yet, or idles between
//! requests). Limits hold per peer address and in total; loopback peers (the proxy's own readiness
//! listener, the app) have a pool of their own that remote peers cannot fill. When a pool or a
//! peer is at its limit, a new connection takes the place of the oldest unfinished one, which is
//! closed: a client holding many half-open connections only ever pushes out its own, and a probe
//! that sends its request at once always gets in. Only when every connection is busy is the new one
//! refused. Refusals and evictions are logged at most once per [`LOG_EVERY`], with their counts.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

/// The shortest time between two warnings of one listener about connections over its limits.
pub const LOG_EVERY: Duration = Duration::from_secs(10);

/// Limits of one listener's connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotLimits {
    /// Connections from non-loopback peers, in total.
    pub total: usize,
    /// Connections from one non-loopback peer address.
    pub per_peer: usize,
    /// Connections from loopback, kept apart from the others.
    pub loopback: usize,
}

/// The connections of one listener.
#[derive(Debug)]
pub struct Slots {
    what: &'static str,
    limits: SlotLimits,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    next: u64,
    conns: HashMap<u64, Entry>,
    /// Refused and evicted connections since the last warning, the last peer among them, and when
    /// that warning was written.
    refused: u64,
    evicted: u64,
    last_peer: Option<IpAddr>,
    last_warned: Option<Instant>,
}

#[derive(Debug)]
struct Entry {
    /// The peer's address (IPv4 peers of an IPv6 socket as IPv4) and port.
    addr: SocketAddr,
    peer: IpAddr,
    /// When the connection became unfinished; `None` while it is busy.
    unfinished_since: Option<Instant>,
    evict: Arc<Notify>,
}

/// One admitted connection; dropping it frees its slot.
#[derive(Debug)]
pub struct Slot {
    id: u64,
    slots: Arc<Slots>,
    evict: Arc<Notify>,
}

impl Slots {
    /// The slots of a listener named `what` in its log lines.
    pub fn new(what: &'static str, limits: SlotLimits) -> Arc<Slots> {
        Arc::new(Slots {
            what,
            limits,
            inner: Mutex::new(Inner::default()),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Admits a connection from `addr`, unfinished, closing the oldest unfinished connection
    /// of its peer or pool if one is full; `None` when every connection there is busy.
    pub fn admit(self: &Arc<Self>, addr: SocketAddr) -> Option<Slot> {
        let addr = SocketAddr::new(canonical(addr.ip()), addr.port());
        let peer = addr.ip();
        let loopback = peer.is_loopback();
        let mut inner = self.lock();
        let same_pool = |e: &Entry| e.peer.is_loopback() == loopback;
        let refused = if loopback {
            !make_room(&mut inner, &same_pool, self.limits.loopback)
        } else {
            !make_room(
                &mut inner,
                &|e: &Entry| e.peer == peer,
                self.limits.per_peer,
            ) || !make_room(&mut inner, &same_pool, self.limits.total)
        };
        if refused {
            inner.refused += 1;
        }
        if inner.refused + inner.evicted > 0 {
            inner.last_peer = Some(peer);
            self.warn(&mut inner);
        }
        if refused {
            return None;
        }
        let id = inner.next;
        inner.next += 1;
        let evict = Arc::new(Notify::new());
        inner.conns.insert(
            id,
            Entry {
                addr,
                peer,
                unfinished_since: Some(Instant::now()),
                evict: evict.clone(),
            },
        );
        Some(Slot {
            id,
            slots: self.clone(),
            evict,
        })
    }

    /// One warning per [`LOG_EVERY`] at most, counting what happened since the last.
    fn warn(&self, inner: &mut Inner) {
        let now = Instant::now();
        if inner
            .last_warned
            .is_some_and(|t| now.duration_since(t) < LOG_EVERY)
        {
            return;
        }
        tracing::warn!(
            listener = self.what,
            evicted = inner.evicted,
            refused = inner.refused,
            last_peer = ?inner.last_peer,
            total = self.limits.total,
            per_peer = self.limits.per_peer,
            "connections over the limit: the oldest unfinished ones were closed, \
             or new ones refused when every connection was busy (at most one line per {}s)",
            LOG_EVERY.as_secs()
        );
        inner.last_warned = Some(now);
        inner.refused = 0;
        inner.evicted = 0;
    }

    /// The connection from `addr` (as its requests name their peer) is busy: see [`Slot::busy`].
    pub fn busy(&self, addr: SocketAddr) {
        self.with(addr, |e| e.unfinished_since = None);
    }

    /// Closes the connection from `addr`, as an eviction does; false if there is none.
    pub fn close(&self, addr: SocketAddr) -> bool {
        let addr = SocketAddr::new(canonical(addr.ip()), addr.port());
        let mut inner = self.lock();
        let id = inner
            .conns
            .iter()
            .find(|(_, e)| e.addr == addr)
            .map(|(id, _)| *id);
        match id.and_then(|id| inner.conns.remove(&id)) {
            Some(e) => {
                e.evict.notify_one();
                true
            }
            None => false,
        }
    }

    fn with(&self, addr: SocketAddr, f: impl FnOnce(&mut Entry)) {
        let addr = SocketAddr::new(canonical(addr.ip()), addr.port());
        if let Some(e) = self.lock().conns.values_mut().find(|e| e.addr == addr) {
            f(e);
        }
    }

    /// Connections held now: (loopback, others).
    pub fn held(&self) -> (usize, usize) {
        let inner = self.lock();
        let lo = inner
            .conns
            .values()
            .filter(|e| e.peer.is_loopback())
            .count();
        (lo, inner.conns.len() - lo)
    }
}

/// Whether the connections that `of` selects have room for one more, after closing the oldest
/// unfinished of them if they are at `cap`.
fn make_room(inner: &mut Inner, of: &dyn Fn(&Entry) -> bool, cap: usize) -> bool {
    if inner.conns.values().filter(|e| of(e)).count() < cap {
        return true;
    }
    let oldest = inner
        .conns
        .iter()
        .filter(|(_, e)| of(e))
        .filter_map(|(id, e)| e.unfinished_since.map(|t| (t, *id)))
        .min();
    match oldest.and_then(|(_, id)| inner.conns.remove(&id)) {
        Some(victim) => {
            victim.evict.notify_one();
            inner.evicted += 1;
            true
        }
        None => false,
    }
}

/// An IPv4 peer seen through an IPv6 socket is the same peer.
fn canonical(peer: IpAddr) -> IpAddr {
    match peer {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(peer, IpAddr::V4),
        v4 => v4,
    }
}

impl Slot {
    fn set(&self, unfinished: bool) {
        if let Some(e) = self.slots.lock().conns.get_mut(&self.id) {
            e.unfinished_since = unfinished.then(Instant::now);
        }
    }

    /// The connection is serving a request (or has finished its handshake): it is not evicted.
    pub fn busy(&self) {
        self.set(false);
    }

    /// The connection waits for its next request: it may be evicted from now on.
    pub fn unfinished(&self) {
        self.set(true);
    }

    /// Whether the connection is busy (and still held).
    pub fn is_busy(&self) -> bool {
        self.slots
            .lock()
            .conns
            .get(&self.id)
            .is_some_and(|e| e.unfinished_since.is_none())
    }

    /// Resolves when a newer connection took this one's place (or it was closed by
    /// [`Slots::close`]); the connection is to be closed.
    pub async fn evicted(&self) {
        self.evict.notified().await;
    }

    /// [`Slot::evicted`] as a future that owns what it waits on.
    pub fn evicted_owned(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let evict = self.evict.clone();
        async move { evict.notified().await }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.slots.lock().conns.remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> SocketAddr {
        SocketAddr::new(s.parse().unwrap(), 40000)
    }

    fn slots(total: usize, per_peer: usize, loopback: usize) -> Arc<Slots> {
        Slots::new(
            "test",
            SlotLimits {
                total,
                per_peer,
                loopback,
            },
        )
    }

    async fn was_evicted(slot: &Slot) -> bool {
        tokio::time::timeout(Duration::from_millis(50), slot.evicted())
            .await
            .is_ok()
    }

    #[tokio::test]
    async fn a_peer_at_its_limit_pushes_out_its_own_oldest_unfinished_connection() {
        let s = slots(100, 3, 10);
        let attacker: Vec<Slot> = (0..3).map(|_| s.admit(ip("10.0.0.9")).unwrap()).collect();
        let other = s.admit(ip("10.0.0.2")).unwrap();
        let newest = s
            .admit(ip("10.0.0.9"))
            .expect("admitted in the oldest's place");
        assert!(was_evicted(&attacker[0]).await);
        assert!(!was_evicted(&attacker[1]).await);
        assert!(
            !was_evicted(&other).await,
            "another peer's connection was closed"
        );
        assert_eq!(s.held(), (0, 4));
        drop(newest);
        assert_eq!(s.held(), (0, 3));
    }

    #[tokio::test]
    async fn busy_connections_are_never_evicted_and_a_full_busy_pool_refuses() {
        let s = slots(2, 2, 1);
        let a = s.admit(ip("10.0.0.1")).unwrap();
        let b = s.admit(ip("10.0.0.2")).unwrap();
        a.busy();
        b.busy();
        assert!(
            s.admit(ip("10.0.0.3")).is_none(),
            "admitted over two busy connections"
        );
        b.unfinished();
        let c = s.admit(ip("10.0.0.3")).expect("b is unfinished again");
        assert!(was_evicted(&b).await);
        assert!(!was_evicted(&a).await);
        drop(c);
    }

    #[tokio::test]
    async fn remote_peers_cannot_take_the_loopback_pool() {
        let s = slots(2, 2, 2);
        let _remote: Vec<Slot> = (0..2)
            .map(|i| s.admit(ip(&format!("10.0.0.{i}"))).unwrap())
            .collect();
        for r in &_remote {
            r.busy();
        }
        assert!(s.admit(ip("10.0.0.7")).is_none());
        let lo = s.admit(ip("127.0.0.1")).expect("loopback has its own pool");
        let lo6 = s.admit(ip("::1")).expect("loopback has its own pool");
        assert_eq!(s.held(), (2, 2));
        drop((lo, lo6));
        // An IPv4 peer on an IPv6 socket counts as that IPv4 peer.
        let s = slots(10, 1, 1);
        let _a = s.admit(ip("10.0.0.1")).unwrap();
        _a.busy();
        assert!(s.admit(ip("::ffff:10.0.0.1")).is_none());
    }

    #[tokio::test]
    async fn a_connection_is_found_by_its_address_to_mark_busy_or_close() {
        let s = slots(1, 1, 1);
        let addr: SocketAddr = "10.0.0.1:5000".parse().unwrap();
        let a = s.admit(addr).unwrap();
        // Seen through an IPv6 socket, a request names the same connection.
        s.busy("[::ffff:10.0.0.1]:5000".parse().unwrap());
        assert!(a.is_busy());
        assert!(s.admit("10.0.0.2:1".parse().unwrap()).is_none());
        assert!(!s.close("10.0.0.1:5001".parse().unwrap()));
        assert!(s.close(addr));
        assert!(was_evicted(&a).await);
        assert!(s.admit("10.0.0.2:1".parse().unwrap()).is_some());
    }
}
