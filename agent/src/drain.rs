//! One shutdown primitive for the whole agent. SIGTERM/SIGINT request a graceful stop; `POST
//! /quitquitquit` an immediate one; `POST /drain` drains Envoy ahead of time so the later SIGTERM
//! stops at once (Istio's native-sidecar preStop). Tasks watch it; `finish` ends the servers.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::watch;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shutdown {
    /// Drain inbound listeners, wait the termination drain duration, stop.
    Graceful,
    /// Stop Envoy now.
    Immediate,
}

#[derive(Clone)]
pub struct Drain {
    triggered: watch::Sender<Option<Shutdown>>,
    finished: watch::Sender<bool>,
    drained_early: Arc<AtomicBool>,
}

impl Default for Drain {
    fn default() -> Self {
        Drain {
            triggered: watch::channel(None).0,
            finished: watch::channel(false).0,
            drained_early: Arc::default(),
        }
    }
}

impl Drain {
    /// Requests a stop. An immediate request overrides a graceful one in progress; a graceful one
    /// becomes immediate when Envoy was already drained through `/drain`.
    pub fn trigger(&self, how: Shutdown) {
        let how = if self.drained_early.load(Ordering::SeqCst) {
            Shutdown::Immediate
        } else {
            how
        };
        self.triggered.send_modify(|t| {
            if *t != Some(Shutdown::Immediate) {
                *t = Some(how);
            }
        });
    }

    /// Records that Envoy's listeners were drained ahead of shutdown.
    pub fn mark_drained(&self) {
        self.drained_early.store(true, Ordering::SeqCst);
    }

    pub fn is_draining(&self) -> bool {
        self.drained_early.load(Ordering::SeqCst) || self.triggered.borrow().is_some()
    }

    /// Resolves with the kind of stop once one has been requested.
    pub async fn triggered(&self) -> Shutdown {
        let mut rx = self.triggered.subscribe();
        match rx.wait_for(Option::is_some).await {
            Ok(v) => v.unwrap_or(Shutdown::Graceful),
            Err(_) => Shutdown::Immediate,
        }
    }

    /// Resolves when an immediate stop is requested.
    pub async fn immediate(&self) {
        let mut rx = self.triggered.subscribe();
        let _ = rx.wait_for(|t| *t == Some(Shutdown::Immediate)).await;
    }

    pub fn finish(&self) {
        self.finished.send_replace(true);
    }

    /// Resolves once shutdown is complete and servers should stop.
    pub async fn finished(&self) {
        let mut rx = self.finished.subscribe();
        let _ = rx.wait_for(|t| *t).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn early_drain_makes_sigterm_immediate() {
        let d = Drain::default();
        assert!(!d.is_draining());
        d.mark_drained();
        assert!(d.is_draining());
        d.trigger(Shutdown::Graceful);
        assert_eq!(d.triggered().await, Shutdown::Immediate);
    }

    #[tokio::test]
    async fn quit_overrides_graceful() {
        let d = Drain::default();
        d.trigger(Shutdown::Graceful);
        assert_eq!(d.triggered().await, Shutdown::Graceful);
        d.trigger(Shutdown::Immediate);
        d.immediate().await;
        d.trigger(Shutdown::Graceful);
        assert_eq!(d.triggered().await, Shutdown::Immediate);
    }
}
