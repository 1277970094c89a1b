//! One shutdown primitive for the whole agent: SIGTERM, SIGINT and `/quitquitquit` trigger it;
//! tasks watch it; `finish` marks the end of the graceful part.

use tokio::sync::watch;

#[derive(Clone)]
pub struct Drain {
    triggered: watch::Sender<bool>,
    finished: watch::Sender<bool>,
}

impl Default for Drain {
    fn default() -> Self {
        Drain {
            triggered: watch::channel(false).0,
            finished: watch::channel(false).0,
        }
    }
}

impl Drain {
    pub fn trigger(&self) {
        self.triggered.send_replace(true);
    }

    pub fn is_triggered(&self) -> bool {
        *self.triggered.borrow()
    }

    /// Resolves once shutdown has been requested.
    pub async fn triggered(&self) {
        let mut rx = self.triggered.subscribe();
        let _ = rx.wait_for(|t| *t).await;
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
