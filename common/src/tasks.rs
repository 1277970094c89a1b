//! Background tasks a process cannot do without (config watch, SDS, status, DNS, xDS, rotation).
//! A task that ends while the process is still meant to run, returning, failing or panicking, is
//! reported by `ended()`, so the program exits non-zero (its container restarts) instead of
//! staying up deaf. Istio's Go processes die on a panic in any goroutine; this keeps that
//! property for tokio tasks, whose panics would otherwise be swallowed by the runtime.

use std::collections::HashMap;
use std::future::Future;

use tokio::task::{Id, JoinSet};

/// Waits for SIGTERM (how Kubernetes stops a pod) or SIGINT, and logs which came; an error
/// when the handlers cannot be installed.
pub async fn stop_signal() -> std::io::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received"),
        _ = int.recv() => tracing::info!("SIGINT received"),
    }
    Ok(())
}

/// How a supervised task ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ended {
    pub name: &'static str,
    /// What happened: `returned`, the error it returned, or the panic message.
    pub how: String,
}

impl std::fmt::Display for Ended {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "background task {:?} ended: {}", self.name, self.how)
    }
}

/// A named set of tasks; see the module doc.
#[derive(Default)]
pub struct Supervisor {
    set: JoinSet<Result<(), String>>,
    names: HashMap<Id, &'static str>,
}

impl Supervisor {
    pub fn new() -> Supervisor {
        Supervisor::default()
    }

    /// Runs `task`, which is meant to run until the process ends (or, for tasks that stop on a
    /// drain, until `wait_for` is asked for it). An `Err` it returns is reported by `ended`.
    pub fn spawn<F, E>(&mut self, name: &'static str, task: F)
    where
        F: Future<Output = Result<(), E>> + Send + 'static,
        E: std::fmt::Display,
    {
        let handle = self
            .set
            .spawn(async move { task.await.map_err(|e| e.to_string()) });
        self.names.insert(handle.id(), name);
    }

    /// Like `spawn`, for a task with no result of its own.
    pub fn spawn_forever<F>(&mut self, name: &'static str, task: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.spawn(name, async move {
            task.await;
            Ok::<(), String>(())
        });
    }

    /// The next task to end, however it ended; pending for ever when there is none, so it can
    /// sit in a `select!` beside the process's other exits.
    pub async fn ended(&mut self) -> Ended {
        match self.set.join_next_with_id().await {
            Some(joined) => {
                let ended = self.describe(joined);
                tracing::error!(task = ended.name, how = %ended.how, "background task ended");
                ended
            }
            None => std::future::pending().await,
        }
    }

    /// After a drain: waits until the task called `name` has finished (the others are left to
    /// the runtime's shutdown).
    pub async fn wait_for(&mut self, name: &str) {
        if !self.names.values().any(|n| *n == name) {
            return;
        }
        while let Some(joined) = self.set.join_next_with_id().await {
            if self.describe(joined).name == name {
                return;
            }
        }
    }

    fn describe(
        &mut self,
        joined: Result<(Id, Result<(), String>), tokio::task::JoinError>,
    ) -> Ended {
        let (id, how) = match joined {
            Ok((id, Ok(()))) => (id, "returned".to_string()),
            Ok((id, Err(e))) => (id, format!("failed: {e}")),
            Err(e) => {
                let id = e.id();
                let how = if e.is_panic() {
                    let payload = e.into_panic();
                    let msg = payload
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_else(|| "(no message)".into());
                    format!("panicked: {msg}")
                } else {
                    "cancelled".to_string()
                };
                (id, how)
            }
        };
        Ended {
            name: self.names.remove(&id).unwrap_or("unnamed"),
            how,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panicking_task_is_reported_by_name() {
        let mut tasks = Supervisor::new();
        tasks.spawn_forever("steady", std::future::pending());
        tasks.spawn_forever("config-watch", async { panic!("boom") });
        let ended = tasks.ended().await;
        assert_eq!(ended.name, "config-watch");
        assert_eq!(ended.how, "panicked: boom");
    }

    #[tokio::test]
    async fn a_failing_or_returning_task_is_reported() {
        let mut tasks = Supervisor::new();
        tasks.spawn("dns", async { Err::<(), _>("address in use") });
        assert_eq!(tasks.ended().await.how, "failed: address in use");
        tasks.spawn_forever("status", async {});
        assert_eq!(tasks.ended().await.how, "returned");
    }

    #[tokio::test]
    async fn wait_for_returns_when_that_task_is_done() {
        let mut tasks = Supervisor::new();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        tasks.spawn_forever("other", std::future::pending());
        tasks.spawn_forever("xds", async {
            let _ = rx.await;
        });
        tx.send(()).ok();
        tasks.wait_for("xds").await;
        tasks.wait_for("not-there").await;
    }
}
