//! The TCP metrics counted since the last scrape, per label set, process-wide. Network
//! filters cannot label their metrics in Envoy 1.40, so each connection's [`Stats`] filter
//! adds its counts here and the Prometheus listener's `istio.stats_flush` moves them into
//! Envoy's labelled counters when a scrape arrives: a scrape sees every byte up to itself.
//!
//! The number of label sets waiting is bounded ([`MAX_LABEL_SETS`]); counts for a new label set
//! beyond it are dropped and counted in [`dropped`], so peers choosing identities cannot grow
//! Envoy's memory without bound between scrapes.
//!
//! [`Stats`]: crate::filters::tcp::Stats

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// Most label sets waiting for a scrape.
pub const MAX_LABEL_SETS: usize = 10_000;

/// Opened, closed, sent bytes, received bytes: the order of
/// [`mesh_common::module::TCP_METRICS`].
pub type Counts = [u64; 4];

static PENDING: Mutex<Option<HashMap<Arc<Vec<String>>, Counts>>> = Mutex::new(None);
static DROPPED: AtomicU64 = AtomicU64::new(0);

/// Adds `counts` to the label set `labels`.
pub fn add(labels: &Arc<Vec<String>>, counts: Counts) {
    if counts.iter().all(|c| *c == 0) {
        return;
    }
    let mut pending = PENDING.lock().unwrap_or_else(PoisonError::into_inner);
    let map = pending.get_or_insert_with(HashMap::new);
    let full = map.len() >= MAX_LABEL_SETS;
    match map.get_mut(labels) {
        Some(have) => {
            for (h, c) in have.iter_mut().zip(counts) {
                *h = h.saturating_add(c);
            }
        }
        None if full => {
            DROPPED.fetch_add(1, Ordering::Relaxed);
        }
        None => {
            map.insert(labels.clone(), counts);
        }
    }
}

/// Everything counted since the last drain.
pub fn drain() -> Vec<(Arc<Vec<String>>, Counts)> {
    let mut pending = PENDING.lock().unwrap_or_else(PoisonError::into_inner);
    pending
        .take()
        .map(|m| m.into_iter().collect())
        .unwrap_or_default()
}

/// Counts dropped for want of room.
pub fn dropped() -> u64 {
    DROPPED.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_add_up_until_drained() {
        let a = Arc::new(vec!["tcp-a".to_string()]);
        add(&a, [1, 0, 10, 20]);
        add(&a, [0, 1, 5, 0]);
        add(&a, [0, 0, 0, 0]);
        let got: Vec<_> = drain().into_iter().filter(|(l, _)| l == &a).collect();
        assert_eq!(got, vec![(a.clone(), [1, 1, 15, 20])]);
        assert!(drain().iter().all(|(l, _)| l != &a));
    }
}
