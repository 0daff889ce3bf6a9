//! A client's task that runs for as long as the client does (the background task that
//! reads the overrides, the sweeper of kept batches): started on a runtime that lasts,
//! and started again when the runtime it ran on ended (its task dropped with it), or
//! on the library's runtime once the client's tasks move there (the connection was
//! carried there, or the caller is off the client's current-thread runtime, which
//! may no longer be driven). The task it replaces ends at its next turn.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::runtime::Handle;

/// Which task runs: `0` for none, else the running one's number, odd when it runs on
/// the library's runtime.
#[derive(Debug, Default)]
pub(crate) struct Ongoing {
    running: Arc<AtomicU64>,
    started: AtomicU64,
}

/// What a running task holds: whether it is still the one to run. Dropped with the
/// task (its end, or its runtime's), it says none runs.
pub(crate) struct Turn {
    running: Arc<AtomicU64>,
    number: u64,
}

impl Ongoing {
    /// Whether a task is to be started: none runs, or it runs off the library's
    /// runtime while the client's tasks are `moving` there (asked only then).
    #[inline]
    pub(crate) fn needed(&self, moving: impl FnOnce() -> bool) -> bool {
        let running = self.running.load(Ordering::Relaxed);
        running == 0 || (running % 2 == 0 && moving())
    }

    /// Starts `task` on `runtime` when one is [`needed`](Ongoing::needed), one
    /// starting at a time: `task` is given the [`Turn`] it holds while it runs.
    pub(crate) fn start<F>(
        &self,
        runtime: &Handle,
        on_library: bool,
        moving: bool,
        task: impl FnOnce(Turn) -> F,
    ) where
        F: Future<Output = ()> + Send + 'static,
    {
        let seen = self.running.load(Ordering::Relaxed);
        if !(seen == 0 || (moving && seen % 2 == 0)) {
            return;
        }
        let number = (self.started.fetch_add(1, Ordering::Relaxed) + 1) * 2 + u64::from(on_library);
        if self
            .running
            .compare_exchange(seen, number, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
        {
            return;
        }
        let turn = Turn {
            running: Arc::clone(&self.running),
            number,
        };
        drop(runtime.spawn(task(turn)));
    }
}

impl Turn {
    /// Whether this task is still the one to run (another replaces it once the
    /// connection was carried elsewhere).
    pub(crate) fn still(&self) -> bool {
        self.running.load(Ordering::Relaxed) == self.number
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        let _ = self
            .running
            .compare_exchange(self.number, 0, Ordering::Relaxed, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn a_task_dropped_with_its_runtime_is_started_again() {
        let ongoing = Ongoing::default();
        assert!(ongoing.needed(|| false));
        let first = runtime();
        ongoing.start(first.handle(), false, false, |turn| async move {
            let _turn = turn;
            std::future::pending::<()>().await;
        });
        assert!(!ongoing.needed(|| false), "one runs");
        // a second start while it runs starts nothing
        ongoing.start(first.handle(), false, false, |_| async { unreachable!() });
        drop(first);
        assert!(ongoing.needed(|| false), "dropped with its runtime");
        let second = runtime();
        ongoing.start(second.handle(), false, false, |turn| async move {
            let _turn = turn;
            std::future::pending::<()>().await;
        });
        assert!(!ongoing.needed(|| false));
    }

    #[test]
    fn a_task_off_the_library_s_runtime_is_replaced_once_the_connection_moved() {
        let ongoing = Ongoing::default();
        let (client_s, library_s) = (runtime(), runtime());
        let (tx, rx) = std::sync::mpsc::channel();
        ongoing.start(client_s.handle(), false, false, |turn| async move {
            tx.send(turn).unwrap();
        });
        client_s.block_on(tokio::task::yield_now());
        let old = rx.recv().unwrap();
        assert!(old.still());
        assert!(!ongoing.needed(|| false));
        assert!(
            ongoing.needed(|| true),
            "the connection moved to the library's runtime"
        );
        ongoing.start(library_s.handle(), true, true, |turn| async move {
            let _turn = turn;
            std::future::pending::<()>().await;
        });
        assert!(!old.still(), "replaced");
        assert!(
            !ongoing.needed(|| true),
            "the new one runs where the connection is"
        );
        drop(old);
        assert!(
            !ongoing.needed(|| true),
            "the old one's end leaves the new one running"
        );
    }
}
