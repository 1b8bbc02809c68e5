//! A shutdown token: set once, when the process is asked to stop (SIGTERM from the kubelet
//! ending a pod, SIGINT from a person), and read by the work in progress, which stops starting
//! new steps and lets the one under way finish or abandons it at a resumable point. Passed in
//! options, never global, so a test can trigger it without a signal.
//!
//! Why every binary needs a handler: `reconcile-once` runs as PID 1 of its distroless image,
//! and the kernel delivers a signal from an ancestor PID namespace to a namespace's init only
//! when init handles it (pid_namespaces(7), "The namespace init process"); without a handler
//! the kubelet's SIGTERM is ignored and the pod keeps acting for its whole grace period, until
//! SIGKILL. Outside a container the default action kills at once, mid-step, Lease held.

use std::sync::{Arc, OnceLock};

use tokio::sync::Notify;

/// Why the process was asked to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// SIGTERM (a kubelet stopping the pod, `kill`).
    Term,
    /// SIGINT (Ctrl-C).
    Int,
}

impl Signal {
    /// The signal's name, for log lines.
    pub fn name(self) -> &'static str {
        match self {
            Signal::Term => "SIGTERM",
            Signal::Int => "SIGINT",
        }
    }

    /// The exit code of a process that stopped early because of this signal: 128 + its
    /// number, as a shell reports a process the signal killed (143 for SIGTERM, 130 for
    /// SIGINT), so "stopped on request" is told apart from success (0), a retryable failure
    /// (1) and a configuration error (2).
    pub fn exit_code(self) -> u8 {
        match self {
            Signal::Term => 143,
            Signal::Int => 130,
        }
    }
}

impl std::fmt::Display for Signal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Shared handle; clones see the same state. A fresh token is never triggered.
#[derive(Clone, Debug, Default)]
pub struct Shutdown(Arc<Inner>);

#[derive(Debug, Default)]
struct Inner {
    signal: OnceLock<Signal>,
    notify: Notify,
}

impl Shutdown {
    /// A token nothing triggers but [`Shutdown::trigger`].
    pub fn new() -> Self {
        Shutdown::default()
    }

    /// A token triggered by the first SIGTERM or SIGINT this process receives. Installs the
    /// handlers at once (a signal from then on no longer kills the process). Must be called
    /// inside a Tokio runtime.
    pub fn on_signals() -> Self {
        let token = Shutdown::new();
        let term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate());
        let int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt());
        let t = token.clone();
        tokio::spawn(async move {
            let term = async {
                match term {
                    Ok(mut s) => {
                        s.recv().await;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot watch SIGTERM");
                        std::future::pending::<()>().await;
                    }
                }
            };
            let int = async {
                match int {
                    Ok(mut s) => {
                        s.recv().await;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot watch SIGINT");
                        std::future::pending::<()>().await;
                    }
                }
            };
            let signal = tokio::select! {
                () = term => Signal::Term,
                () = int => Signal::Int,
            };
            tracing::warn!(
                signal = signal.name(),
                "asked to stop: starting nothing new, finishing or abandoning the step under way"
            );
            t.trigger(signal);
        });
        token
    }

    /// Asks the work to stop; the first signal wins.
    pub fn trigger(&self, signal: Signal) {
        let _ = self.0.signal.set(signal);
        self.0.notify.notify_waiters();
    }

    /// The signal that asked to stop, if one did.
    pub fn signal(&self) -> Option<Signal> {
        self.0.signal.get().copied()
    }

    /// Whether the work was asked to stop.
    pub fn is_triggered(&self) -> bool {
        self.signal().is_some()
    }

    /// Completes once the work is asked to stop (at once if it already was).
    pub async fn triggered(&self) -> Signal {
        loop {
            let notified = self.0.notify.notified();
            tokio::pin!(notified);
            // Registered before the check, so a trigger in between is not lost.
            notified.as_mut().enable();
            if let Some(s) = self.signal() {
                return s;
            }
            notified.await;
        }
    }

    /// Completes `bound` after the work was asked to stop, or at once on a second SIGTERM or
    /// SIGINT (a person pressing Ctrl-C again): the moment a binary gives up waiting for its
    /// work to reach a safe point and abandons it. Returns the first signal.
    pub async fn abandon_after(&self, bound: std::time::Duration) -> Signal {
        let first = self.triggered().await;
        let again = async {
            let term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate());
            let int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt());
            match (term, int) {
                (Ok(mut t), Ok(mut i)) => {
                    tokio::select! {
                        _ = t.recv() => {}
                        _ = i.recv() => {}
                    }
                }
                _ => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            () = tokio::time::sleep(bound) => {}
            () = again => tracing::warn!("asked again: stopping at once"),
        }
        first
    }

    /// Sleeps for `d`, or less when asked to stop meanwhile; `true` when it was.
    pub async fn sleep(&self, d: std::time::Duration) -> bool {
        tokio::select! {
            _ = self.triggered() => true,
            () = tokio::time::sleep(d) => self.is_triggered(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_trigger_wakes_a_waiter_and_the_first_signal_wins() {
        let s = Shutdown::new();
        assert!(!s.is_triggered());
        let waiter = tokio::spawn({
            let s = s.clone();
            async move { s.triggered().await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished());
        s.trigger(Signal::Int);
        s.trigger(Signal::Term);
        assert_eq!(waiter.await.ok(), Some(Signal::Int));
        assert_eq!(s.signal(), Some(Signal::Int));
        // Already triggered: at once.
        assert_eq!(s.triggered().await, Signal::Int);
    }

    #[tokio::test]
    async fn sleep_ends_early_when_triggered() {
        let s = Shutdown::new();
        assert!(!s.sleep(Duration::from_millis(5)).await);
        let t = s.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            t.trigger(Signal::Term);
        });
        let started = std::time::Instant::now();
        assert!(s.sleep(Duration::from_secs(30)).await);
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn exit_codes_are_128_plus_the_signal_number() {
        assert_eq!(Signal::Term.exit_code(), 128 + 15);
        assert_eq!(Signal::Int.exit_code(), 128 + 2);
    }
}
